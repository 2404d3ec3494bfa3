//! Azure Blob Storage: one blob per election, led through the blob's native lease.
//!
//! The service judges expiry (a lease lasts 15 to 60 seconds). The lease record lives
//! in the blob's content, written only under the lease and only if the blob is still
//! the version read; the lease id is derived from (holder, token), so a renewal is a
//! compare-and-set on both. The fencing token is raised on every new acquisition,
//! which is itself conditional on the blob being unchanged since it was read.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::{digest, hmac};
use tenure::store::{
    Acquire, AcquireRequest, Judgement, LedgerEntry, LedgerWrite, ObservedExpiry, Renew, check_ledger_value, check_ttl,
};
use tenure::{ElectionName, ErrorKind, Evict, LeaseRecord, LeaseStore, StoreError, WorkKey};

use crate::http::{self, Reply, encode, hex, http_date, xml_values};
use crate::object::{Body, WorkBody, work_key, work_write_at};
use crate::{check_prefix, env_var, split_url};

/// The service version requests ask for; Azurite and Azure both serve it.
const API_VERSION: &str = "2021-12-02";
/// The account and key every Azure storage emulator accepts (they are published).
const DEV_ACCOUNT: &str = "devstoreaccount1";
const DEV_KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Shortest and longest lease the service grants.
pub const MIN_LEASE: Duration = Duration::from_secs(15);
/// See [`MIN_LEASE`].
pub const MAX_LEASE: Duration = Duration::from_secs(60);
const MAX_TRIES: usize = 6;

/// Where and how to reach a container.
#[derive(Clone)]
pub struct AzureConfig {
    /// The storage account.
    pub account: String,
    /// The account key (decoded).
    pub key: Vec<u8>,
    /// The blob endpoint, e.g. `https://ACCOUNT.blob.core.windows.net` or Azurite's
    /// `http://127.0.0.1:10000/devstoreaccount1`.
    pub endpoint: String,
    /// The container (created on first use).
    pub container: String,
    /// Blob names start with this (default `tenure`).
    pub prefix: String,
}

impl std::fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureConfig")
            .field("account", &self.account)
            .field("endpoint", &self.endpoint)
            .field("container", &self.container)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl AzureConfig {
    /// The storage emulator's well-known development account at `endpoint` (e.g.
    /// Azurite's `http://127.0.0.1:10000/devstoreaccount1`).
    pub fn emulator(endpoint: &str, container: &str) -> Result<Self, StoreError> {
        check_container(container)?;
        Ok(Self {
            account: DEV_ACCOUNT.into(),
            key: decode_key(DEV_KEY)?,
            endpoint: endpoint.trim_end_matches('/').into(),
            container: container.into(),
            prefix: "tenure".into(),
        })
    }

    /// Reads `azblob://ACCOUNT/CONTAINER[/PREFIX][?endpoint=URL]`. The key and endpoint
    /// come from `AZURE_STORAGE_CONNECTION_STRING` (`AccountName`, `AccountKey`,
    /// `BlobEndpoint`, `EndpointSuffix`, `DefaultEndpointsProtocol`, or
    /// `UseDevelopmentStorage=true`), else the key from `AZURE_STORAGE_KEY`.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (rest, params) =
            split_url(url, "azblob://", &["endpoint"], "an Azure Blob URL", "azblob://ACCOUNT/CONTAINER[/PREFIX]")?;
        let mut parts = rest.splitn(3, '/');
        let account = parts.next().unwrap_or_default();
        let container = parts.next().unwrap_or_default();
        let prefix = parts.next().unwrap_or_default();
        if account.is_empty() || !account.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
            return Err(StoreError::invalid(format!(
                "{url:?}: the account name {account:?} must be lowercase letters and digits"
            )));
        }
        check_container(container)?;
        let prefix = if prefix.trim_matches('/').is_empty() { "tenure" } else { prefix };
        check_prefix(prefix)?;
        let conn = env_var("AZURE_STORAGE_CONNECTION_STRING").map(|s| ConnectionString::parse(&s)).transpose()?;
        let (key, endpoint) = match conn {
            Some(c) if c.account == account => (c.key, c.endpoint),
            Some(c) => {
                return Err(StoreError::new(
                    ErrorKind::Misconfigured,
                    format!("AZURE_STORAGE_CONNECTION_STRING is for the account {:?}, not {account:?}", c.account),
                ));
            }
            None => {
                let key = env_var("AZURE_STORAGE_KEY").ok_or_else(|| {
                    StoreError::new(
                        ErrorKind::Unauthorized,
                        "no Azure credentials: set AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY",
                    )
                })?;
                (decode_key(&key)?, format!("https://{account}.blob.core.windows.net"))
            }
        };
        Ok(Self {
            account: account.into(),
            key,
            endpoint: params[0].clone().unwrap_or(endpoint).trim_end_matches('/').into(),
            container: container.into(),
            prefix: prefix.into(),
        })
    }
}

fn decode_key(key: &str) -> Result<Vec<u8>, StoreError> {
    B64.decode(key.trim()).map_err(|e| {
        StoreError::new(ErrorKind::Unauthorized, "the Azure account key is not valid base64").with_source(e)
    })
}

/// Container names: 3 to 63 lowercase letters, digits and single hyphens, starting and
/// ending with a letter or digit.
fn check_container(name: &str) -> Result<(), StoreError> {
    let ok = (3..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--");
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "container name {name:?} is not valid: 3 to 63 lowercase letters, digits and single hyphens, \
             starting and ending with a letter or digit"
        )))
    }
}

/// The parts of an Azure storage connection string tenure uses.
struct ConnectionString {
    account: String,
    key: Vec<u8>,
    endpoint: String,
}

impl ConnectionString {
    fn parse(s: &str) -> Result<Self, StoreError> {
        let mut fields = std::collections::HashMap::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                StoreError::new(
                    ErrorKind::Misconfigured,
                    "AZURE_STORAGE_CONNECTION_STRING is not a list of Name=Value pairs separated by ;",
                )
            })?;
            fields.insert(k.to_ascii_lowercase(), v.to_string());
        }
        if fields.get("usedevelopmentstorage").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(Self {
                account: DEV_ACCOUNT.into(),
                key: decode_key(DEV_KEY)?,
                endpoint: format!("http://127.0.0.1:10000/{DEV_ACCOUNT}"),
            });
        }
        let get = |k: &str| fields.get(k).cloned();
        let account = get("accountname").ok_or_else(|| {
            StoreError::new(ErrorKind::Misconfigured, "AZURE_STORAGE_CONNECTION_STRING has no AccountName")
        })?;
        let key = decode_key(&get("accountkey").ok_or_else(|| {
            StoreError::new(
                ErrorKind::Unauthorized,
                "AZURE_STORAGE_CONNECTION_STRING has no AccountKey (shared access signatures are not supported)",
            )
        })?)?;
        let endpoint = get("blobendpoint").unwrap_or_else(|| {
            let protocol = get("defaultendpointsprotocol").unwrap_or_else(|| "https".into());
            let suffix = get("endpointsuffix").unwrap_or_else(|| "core.windows.net".into());
            format!("{protocol}://{account}.blob.{suffix}")
        });
        Ok(Self { account, key, endpoint })
    }
}

/// The lease id of a grant: derived from (holder, token), so that only that grant can renew.
fn lease_id(holder: &str, token: u64) -> String {
    let d = digest::digest(&digest::SHA256, format!("tenure\n{holder}\n{token}").as_bytes());
    let h = hex(&d.as_ref()[..16]);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The lease length to ask the service for: the TTL rounded up to whole seconds, which
/// must lie within what the service grants.
fn lease_seconds(ttl: Duration) -> Result<u64, StoreError> {
    check_ttl(ttl)?;
    if ttl < MIN_LEASE || ttl > MAX_LEASE {
        return Err(StoreError::invalid(format!(
            "TTL {ttl:?} is out of range for Azure blob leases, which last 15 to 60 seconds"
        )));
    }
    Ok(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
}

/// One read of an election's blob.
struct Blob {
    etag: String,
    /// `available`, `leased`, `expired`, `breaking` or `broken`.
    lease_state: String,
    body: Body,
    /// What this handle's observations say of this version (see [`AzureStore`]).
    seen: Judgement,
}

impl Blob {
    fn leased(&self) -> bool {
        matches!(self.lease_state.as_str(), "leased" | "breaking")
    }

    /// Whether the record may still be live: it names a holder, and its lease is active
    /// or this handle has not yet seen this version unchanged for the TTL plus margin.
    fn live(&self) -> bool {
        self.body.holder.is_some() && (self.leased() || matches!(self.seen, Judgement::Live { .. }))
    }

    /// The lease id to write with: the record's grant, while its lease is active.
    fn active_lease(&self) -> Option<String> {
        if self.leased() { self.lease_id() } else { None }
    }

    /// The live record, if any.
    fn record(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        if !self.live() {
            return Ok(None);
        }
        let remaining = match self.seen {
            Judgement::Live { remaining } if !self.leased() => Some(remaining),
            _ => None,
        };
        let mut rec = self.body.record(election, remaining)?;
        if let Some(r) = rec.as_mut() {
            r.evicted |= self.lease_state == "breaking";
        }
        Ok(rec)
    }

    fn lease_id(&self) -> Option<String> {
        self.body.holder.as_deref().map(|h| lease_id(h, self.body.token))
    }
}

/// The Azure Blob lease store.
///
/// The blob's lease, judged by the service, decides. As a second guard against a
/// service that loses a lease before its term ends (Azurite forgets leases when it
/// restarts), a candidate also takes over a record that names a holder only after this
/// handle has seen that version unchanged for the TTL plus margin ([`ObservedExpiry`]).
pub struct AzureStore {
    http: reqwest::Client,
    config: AzureConfig,
    seen: ObservedExpiry,
}

impl AzureStore {
    /// Opens the store an `azblob://` URL names ([`AzureConfig::from_url`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(AzureConfig::from_url(url)?).await
    }

    /// Opens the store: creates the container if it does not exist (which also checks
    /// the credentials).
    pub async fn connect_with(config: AzureConfig) -> Result<Self, StoreError> {
        let store = Self { http: http::client()?, config, seen: ObservedExpiry::new() };
        let what = format!("creating the container {}", store.config.container);
        let r = store.call("PUT", None, "restype=container", &[], Vec::new(), &what, true).await?;
        match r.status {
            201 | 409 => Ok(store),
            _ => Err(r.error(&what, true)),
        }
    }

    /// The blob of a work-ledger entry (see [`crate::object::work_key`]).
    fn work_blob(&self, election: &ElectionName, key: &WorkKey) -> String {
        work_key(&format!("{}/", self.config.prefix.trim_matches('/')), election, key)
    }

    fn blob_name(&self, election: &ElectionName) -> String {
        format!("{}/{}", self.config.prefix.trim_matches('/'), election.as_str())
    }

    /// Sends a request signed with the account key (the SharedKey scheme).
    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        method: &str,
        blob: Option<&str>,
        query: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
        what: &str,
        writes: bool,
    ) -> Result<Reply, StoreError> {
        let c = &self.config;
        let path = match blob {
            Some(b) => format!("{}/{}", c.container, encode(b, true)),
            None => c.container.clone(),
        };
        let full =
            if query.is_empty() { format!("{}/{path}", c.endpoint) } else { format!("{}/{path}?{query}", c.endpoint) };
        let url = reqwest::Url::parse(&full)
            .map_err(|e| StoreError::invalid(format!("cannot form an Azure address from {full:?}")).with_source(e))?;
        let mut all: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
        all.push(("x-ms-date".into(), http_date(SystemTime::now())));
        all.push(("x-ms-version".into(), API_VERSION.into()));
        let header = |name: &str| all.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or("");
        let length = if body.is_empty() { String::new() } else { body.len().to_string() };
        let mut ms: Vec<&(String, String)> = all.iter().filter(|(k, _)| k.starts_with("x-ms-")).collect();
        ms.sort();
        let canonical_headers: String = ms.iter().map(|(k, v)| format!("{k}:{}\n", v.trim())).collect();
        let mut params: Vec<(String, String)> =
            url.query_pairs().map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned())).collect();
        params.sort();
        let mut resource = format!("/{}{}", c.account, url.path());
        for (k, v) in &params {
            resource.push_str(&format!("\n{k}:{v}"));
        }
        let to_sign = format!(
            "{method}\n\n\n{length}\n\n{}\n\n\n{}\n{}\n\n\n{canonical_headers}{resource}",
            header("content-type"),
            header("if-match"),
            header("if-none-match"),
        );
        let sig = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &c.key), to_sign.as_bytes());
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        let mut req = self.http.request(method, url).body(body);
        for (k, v) in &all {
            req = req.header(k, v);
        }
        req = req.header("authorization", format!("SharedKey {}:{}", c.account, B64.encode(sig.as_ref())));
        http::send(req, what, writes).await
    }

    async fn read(&self, election: &ElectionName) -> Result<Option<Blob>, StoreError> {
        let name = self.blob_name(election);
        let what = format!("reading the blob {name}");
        let r = self.call("GET", Some(&name), "", &[], Vec::new(), &what, false).await?;
        match r.status {
            200 => {
                let etag = r.header("etag").unwrap_or_default().to_string();
                let lease_state = r.header("x-ms-lease-state").unwrap_or("available").to_string();
                let body = Body::parse(&name, &r.body)?;
                let seen = if body.holder.is_some() {
                    self.seen.saw(election, &etag, body.ttl())
                } else {
                    self.seen.forget(election);
                    Judgement::Expired
                };
                Ok(Some(Blob { etag, lease_state, body, seen }))
            }
            404 => Ok(None),
            _ => Err(r.error(&what, false)),
        }
    }

    /// Creates the blob of `election`, holding nobody, unless it exists.
    async fn create(&self, election: &ElectionName) -> Result<(), StoreError> {
        let name = self.blob_name(election);
        let what = format!("creating the blob {name}");
        let headers = [
            ("x-ms-blob-type", "BlockBlob".to_string()),
            ("content-type", "application/json".to_string()),
            ("if-none-match", "*".to_string()),
        ];
        let r = self.call("PUT", Some(&name), "", &headers, Body::vacant(0, 0).encode(), &what, true).await?;
        match r.status {
            201 | 409 | 412 => Ok(()),
            _ => Err(r.error(&what, true)),
        }
    }

    /// Writes `body` under the lease `lease` (none: the blob has no active lease), if the
    /// blob is still at `etag`. False if not.
    async fn put(
        &self,
        election: &ElectionName,
        lease: Option<&str>,
        etag: &str,
        body: &Body,
    ) -> Result<bool, StoreError> {
        let name = self.blob_name(election);
        let what = format!("writing the blob {name}");
        let mut headers = vec![
            ("x-ms-blob-type", "BlockBlob".to_string()),
            ("content-type", "application/json".to_string()),
            ("if-match", etag.to_string()),
        ];
        if let Some(id) = lease {
            headers.push(("x-ms-lease-id", id.to_string()));
        }
        let sent = self.seen.now();
        let r = self.call("PUT", Some(&name), "", &headers, body.encode(), &what, true).await?;
        match r.status {
            201 => {
                match r.header("etag") {
                    Some(tag) if body.holder.is_some() => self.seen.wrote(election, tag, sent),
                    _ => self.seen.forget(election),
                }
                Ok(true)
            }
            // The blob changed, or the lease is not this one.
            412 | 409 => Ok(false),
            _ => Err(r.error(&what, true)),
        }
    }

    /// A lease action; answers the HTTP status (success or 409/412, which mean "not now").
    async fn lease(
        &self,
        election: &ElectionName,
        action: &str,
        headers: &[(&str, String)],
    ) -> Result<u16, StoreError> {
        let name = self.blob_name(election);
        let what = format!("lease {action} on the blob {name}");
        let mut all = vec![("x-ms-lease-action", action.to_string())];
        all.extend(headers.iter().cloned());
        let r = self.call("PUT", Some(&name), "comp=lease", &all, Vec::new(), &what, true).await?;
        match r.status {
            200..=202 | 409 | 412 => Ok(r.status),
            _ => Err(r.error(&what, true)),
        }
    }

    /// Takes (or, with the same id, extends) the lease `id` if the blob is still at `etag`.
    async fn take(&self, election: &ElectionName, id: &str, seconds: u64, etag: &str) -> Result<bool, StoreError> {
        let headers = [
            ("x-ms-lease-duration", seconds.to_string()),
            ("x-ms-proposed-lease-id", id.into()),
            ("if-match", etag.into()),
        ];
        Ok(self.lease(election, "acquire", &headers).await? == 201)
    }

    fn busy(election: &ElectionName) -> StoreError {
        StoreError::unavailable(format!("{election}: the blob kept changing under {MAX_TRIES} tries; try again"))
    }
}

#[async_trait::async_trait]
impl LeaseStore for AzureStore {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        req.validate()?;
        let seconds = lease_seconds(req.ttl)?;
        let e = &req.election;
        for _ in 0..MAX_TRIES {
            let Some(blob) = self.read(e).await? else {
                self.create(e).await?;
                continue;
            };
            let me = req.holder.as_str();
            if blob.leased() && blob.body.holder.is_none() {
                // Leased, but the new holder has not written its record yet.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            if blob.live() {
                let ours =
                    blob.body.holder.as_deref() == Some(me) && !blob.body.evicted && blob.lease_state != "breaking";
                match blob.record(e)? {
                    Some(rec) if !ours => return Ok(Acquire::Held(rec)),
                    Some(_) => {
                        let id = lease_id(me, blob.body.token);
                        let next = blob.body.renewed(req.ttl, Some(&req.metadata));
                        if self.take(e, &id, seconds, &blob.etag).await?
                            && self.put(e, Some(&id), &blob.etag, &next).await?
                        {
                            return Ok(Acquire::Acquired(next.record(e, None)?.expect("names its holder")));
                        }
                    }
                    None => {}
                }
                continue;
            }
            let token = blob.body.token + 1;
            let id = lease_id(me, token);
            if !self.take(e, &id, seconds, &blob.etag).await? {
                continue;
            }
            let next = Body::grant(req, token, blob.body.rev + 1);
            match self.put(e, Some(&id), &blob.etag, &next).await {
                Ok(true) => return Ok(Acquire::Acquired(next.record(e, None)?.expect("names its holder"))),
                outcome => {
                    // The record could not be written under the lease: give the lease back.
                    let _ = self.lease(e, "release", &[("x-ms-lease-id", id)]).await;
                    outcome?;
                }
            }
        }
        Err(Self::busy(e))
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        let seconds = lease_seconds(ttl)?;
        let e = &held.election;
        for _ in 0..MAX_TRIES {
            let Some(blob) = self.read(e).await? else { return Ok(Renew::Lost(None)) };
            let Some(rec) = blob.record(e)? else { return Ok(Renew::Lost(None)) };
            if rec.holder != held.holder || rec.token != held.token || rec.evicted {
                return Ok(Renew::Lost(Some(rec)));
            }
            let id = lease_id(held.holder.as_str(), held.token.0);
            if !self.take(e, &id, seconds, &blob.etag).await? {
                continue;
            }
            let next = blob.body.renewed(ttl, None);
            if self.put(e, Some(&id), &blob.etag, &next).await? {
                return Ok(Renew::Renewed(next.record(e, None)?.expect("names its holder")));
            }
        }
        Err(Self::busy(e))
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let e = &held.election;
        for _ in 0..MAX_TRIES {
            let Some(blob) = self.read(e).await? else { return Ok(()) };
            let b = &blob.body;
            let ours = blob.live()
                && b.holder.as_deref() == Some(held.holder.as_str())
                && b.token == held.token.0
                && b.rev == held.revision.0;
            if !ours {
                return Ok(());
            }
            let id = blob.active_lease();
            // Clear the record first, so that readers never see a released holder as leading.
            if self.put(e, id.as_deref(), &blob.etag, &Body::vacant(b.token, b.rev + 1)).await? {
                if let Some(id) = id {
                    self.lease(e, "release", &[("x-ms-lease-id", id)]).await?;
                }
                return Ok(());
            }
        }
        Err(Self::busy(e))
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        match self.read(election).await? {
            Some(blob) => blob.record(election),
            None => Ok(None),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let base = format!("{}/", self.config.prefix.trim_matches('/'));
        let what = format!("listing the container {}", self.config.container);
        let mut names = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut query = format!("restype=container&comp=list&prefix={}", encode(&format!("{base}{prefix}"), false));
            if let Some(m) = &marker {
                query.push_str(&format!("&marker={}", encode(m, false)));
            }
            let r = self.call("GET", None, &query, &[], Vec::new(), &what, false).await?;
            if r.status != 200 {
                return Err(r.error(&what, false));
            }
            let xml = String::from_utf8_lossy(&r.body);
            names.extend(xml_values(&xml, "Name"));
            marker = xml_values(&xml, "NextMarker").into_iter().next().filter(|m| !m.is_empty());
            if marker.is_none() {
                break;
            }
        }
        let mut out = Vec::new();
        for name in names {
            let Some(election) = name.strip_prefix(&base).and_then(|n| ElectionName::new(n).ok()) else { continue };
            if let Some(rec) = self.get(&election).await? {
                out.push(rec);
            }
        }
        out.sort_by(|a, b| a.election.cmp(&b.election));
        Ok(out)
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        for _ in 0..MAX_TRIES {
            let Some(blob) = self.read(election).await? else { return Ok(None) };
            let Some(rec) = blob.record(election)? else { return Ok(None) };
            let id = blob.active_lease();
            let b = &blob.body;
            let (next, period) = match how {
                Evict::AfterTerm if rec.evicted => return Ok(Some(rec)),
                // Breaking with the longest period ends the lease when its term runs out.
                Evict::AfterTerm => (Body { evicted: true, rev: b.rev + 1, ..b.clone() }, MAX_LEASE.as_secs()),
                Evict::Now => (Body::vacant(b.token, b.rev + 1), 0),
            };
            if self.put(election, id.as_deref(), &blob.etag, &next).await? {
                if id.is_some() {
                    self.lease(election, "break", &[("x-ms-lease-break-period", period.to_string())]).await?;
                }
                return Ok(Some(rec));
            }
        }
        Err(Self::busy(election))
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!("azblob://{}/{}/{} at {}", c.account, c.container, c.prefix, c.endpoint)
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let name = self.work_blob(election, key);
        let what = format!("reading the blob {name}");
        let r = self.call("GET", Some(&name), "", &[], Vec::new(), &what, false).await?;
        match r.status {
            200 => WorkBody::parse(&name, &r.body)?.entry(&name, r.header("etag").unwrap_or_default().to_string()),
            404 => Ok(None),
            _ => Err(r.error(&what, false)),
        }
    }

    /// A blob per entry, written with `if-match` on its ETag, or `if-none-match: *` where
    /// none may exist (see `WorkBody`).
    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        check_ledger_value(value)?;
        let name = self.work_blob(election, key);
        let what = format!("writing the blob {name}");
        let r = self.call("GET", Some(&name), "", &[], Vec::new(), &what, false).await?;
        let current = match r.status {
            200 => Some((r.header("etag").unwrap_or_default().to_string(), WorkBody::parse(&name, &r.body)?)),
            404 => None,
            _ => return Err(r.error(&what, false)),
        };
        let Some((at, rev)) = work_write_at(current.as_ref().map(|(v, b)| (v.as_str(), b)), expected) else {
            return Ok(LedgerWrite::Conflict);
        };
        let condition = match at {
            Some(etag) => ("if-match", etag),
            None => ("if-none-match", "*".to_string()),
        };
        let headers =
            [("x-ms-blob-type", "BlockBlob".to_string()), ("content-type", "application/json".to_string()), condition];
        let r =
            self.call("PUT", Some(&name), "", &headers, WorkBody::new(rev, keep, value).encode(), &what, true).await?;
        match r.status {
            201 => Ok(LedgerWrite::Written(r.header("etag").unwrap_or_default().to_string())),
            409 | 412 => Ok(LedgerWrite::Conflict),
            _ => Err(r.error(&what, true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_are_guids_per_grant() {
        let a = lease_id("host.1.x", 7);
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
        assert_eq!(a, lease_id("host.1.x", 7));
        assert_ne!(a, lease_id("host.1.x", 8));
        assert_ne!(a, lease_id("host.2.x", 7));
    }

    #[test]
    fn lease_lengths_are_what_the_service_grants() {
        assert_eq!(lease_seconds(Duration::from_secs(15)).unwrap(), 15);
        assert_eq!(lease_seconds(Duration::from_millis(15_001)).unwrap(), 16);
        for bad in [Duration::from_secs(10), Duration::from_secs(61)] {
            assert!(lease_seconds(bad).unwrap_err().to_string().contains("15 to 60 seconds"));
        }
    }

    #[test]
    fn connection_strings() {
        let c = ConnectionString::parse("UseDevelopmentStorage=true").unwrap();
        assert_eq!((c.account.as_str(), c.key.len()), (DEV_ACCOUNT, 64));
        let c = ConnectionString::parse(&format!(
            "DefaultEndpointsProtocol=http;AccountName=acct;AccountKey={DEV_KEY};EndpointSuffix=example.net"
        ))
        .unwrap();
        assert_eq!(c.endpoint, "http://acct.blob.example.net");
        assert!(ConnectionString::parse("AccountName=a;AccountKey=%%%").is_err());
        assert!(ConnectionString::parse("AccountName=a").err().unwrap().to_string().contains("AccountKey"));
    }
}
