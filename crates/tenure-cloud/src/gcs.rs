//! Google Cloud Storage: one object per election, written by multipart upload with
//! `ifGenerationMatch` (0 for "only if absent").

use std::time::{Duration, Instant};

use tenure::store::ObservedExpiry;
use tenure::{ErrorKind, StoreError};
use tokio::sync::Mutex;

use crate::http::{self, Reply, encode};
use crate::object::{Objects, ObservedStore, Stored, read_each};
use crate::{bucket_and_prefix, env_var, split_url};

/// The GCS lease store: [`ObservedStore`] over [`GcsObjects`].
pub type GcsStore = ObservedStore<GcsObjects>;

const METADATA_TOKEN_URL: &str =
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token";

/// How requests to GCS are authorized.
#[derive(Clone, Debug)]
pub enum GcsAuth {
    /// No authorization: an emulator.
    None,
    /// A fixed OAuth access token (e.g. from `gcloud auth print-access-token`).
    Token(String),
    /// Tokens of the instance's service account, from the metadata server of Compute
    /// Engine, GKE and Cloud Run, refreshed before they expire.
    MetadataServer,
}

/// Where and how to reach a bucket.
#[derive(Clone, Debug)]
pub struct GcsConfig {
    /// The bucket.
    pub bucket: String,
    /// Object names start with this (default `tenure`).
    pub prefix: String,
    /// The service's address (default `https://storage.googleapis.com`).
    pub endpoint: String,
    /// The project a missing bucket is created in; without one, a missing bucket is an error.
    pub project: Option<String>,
    /// How requests are authorized.
    pub auth: GcsAuth,
}

impl GcsConfig {
    /// Reads `gs://BUCKET[/PREFIX][?endpoint=URL&project=P]`. The endpoint also comes from
    /// `STORAGE_EMULATOR_HOST` (then no authorization is sent), the project from
    /// `GOOGLE_CLOUD_PROJECT`; an access token from `GOOGLE_OAUTH_ACCESS_TOKEN`, else from
    /// the metadata server.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (rest, params) = split_url(url, "gs://", &["endpoint", "project"], "a GCS URL", "gs://BUCKET[/PREFIX]")?;
        let (bucket, prefix) =
            bucket_and_prefix(&rest, b"_", "lowercase letters, digits, dots, hyphens and underscores")?;
        let emulator = env_var("STORAGE_EMULATOR_HOST");
        let token = env_var("GOOGLE_OAUTH_ACCESS_TOKEN");
        let auth = match (&token, &emulator, &params[0]) {
            (Some(t), _, _) => GcsAuth::Token(t.clone()),
            (None, Some(_), _) | (None, None, Some(_)) => GcsAuth::None,
            (None, None, None) => GcsAuth::MetadataServer,
        };
        let endpoint = params[0].clone().or(emulator).unwrap_or_else(|| "https://storage.googleapis.com".into());
        let endpoint = if endpoint.contains("://") { endpoint } else { format!("http://{endpoint}") };
        Ok(Self {
            bucket: bucket.into(),
            prefix: prefix.into(),
            endpoint: endpoint.trim_end_matches('/').into(),
            project: params[1].clone().or_else(|| env_var("GOOGLE_CLOUD_PROJECT")),
            auth,
        })
    }
}

/// The objects of one GCS bucket.
pub struct GcsObjects {
    http: reqwest::Client,
    config: GcsConfig,
    /// A token from the metadata server and when to fetch a new one.
    token: Mutex<Option<(String, Instant)>>,
}

impl GcsStore {
    /// Opens the store a `gs://` URL names ([`GcsConfig::from_url`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(GcsConfig::from_url(url)?).await
    }

    /// Opens the store: checks that the bucket can be reached, and creates it if it does
    /// not exist and a project is known.
    pub async fn connect_with(config: GcsConfig) -> Result<Self, StoreError> {
        let prefix = config.prefix.clone();
        let objects = GcsObjects { http: http::client()?, config, token: Mutex::new(None) };
        objects.ensure_bucket().await?;
        Ok(ObservedStore::new(objects, &prefix, ObservedExpiry::new()))
    }
}

impl GcsObjects {
    async fn authorize(&self, req: reqwest::RequestBuilder) -> Result<reqwest::RequestBuilder, StoreError> {
        match &self.config.auth {
            GcsAuth::None => Ok(req),
            GcsAuth::Token(t) => Ok(req.bearer_auth(t)),
            GcsAuth::MetadataServer => {
                let mut cached = self.token.lock().await;
                if let Some((t, until)) = cached.as_ref()
                    && Instant::now() < *until
                {
                    return Ok(req.bearer_auth(t));
                }
                let what = "fetching an access token from the metadata server";
                let r = http::send(self.http.get(METADATA_TOKEN_URL).header("metadata-flavor", "Google"), what, false)
                    .await
                    .map_err(|e| {
                        StoreError::new(
                            ErrorKind::Unauthorized,
                            "no GCS credentials: set GOOGLE_OAUTH_ACCESS_TOKEN, or run where the metadata server answers",
                        )
                        .with_source(e)
                    })?;
                if r.status != 200 {
                    return Err(r.error(what, false));
                }
                let v: serde_json::Value = serde_json::from_slice(&r.body)
                    .map_err(|e| StoreError::unavailable(format!("{what}: unreadable answer")).with_source(e))?;
                let token = v["access_token"].as_str().unwrap_or_default().to_string();
                let life = Duration::from_secs(v["expires_in"].as_u64().unwrap_or(300));
                *cached = Some((token.clone(), Instant::now() + life.saturating_sub(Duration::from_secs(60))));
                Ok(req.bearer_auth(token))
            }
        }
    }

    async fn call(&self, req: reqwest::RequestBuilder, what: &str, writes: bool) -> Result<Reply, StoreError> {
        http::send(self.authorize(req).await?, what, writes).await
    }

    fn object_url(&self, key: &str) -> String {
        let c = &self.config;
        format!("{}/storage/v1/b/{}/o/{}", c.endpoint, c.bucket, encode(key, false))
    }

    async fn ensure_bucket(&self) -> Result<(), StoreError> {
        let c = &self.config;
        let what = format!("checking the bucket {}", c.bucket);
        let r = self.call(self.http.get(format!("{}/storage/v1/b/{}", c.endpoint, c.bucket)), &what, false).await?;
        match (r.status, &c.project) {
            (200, _) => Ok(()),
            (404, Some(project)) => {
                let what = format!("creating the bucket {} in project {project}", c.bucket);
                let url = format!("{}/storage/v1/b?project={}", c.endpoint, encode(project, false));
                let body = serde_json::json!({ "name": c.bucket }).to_string();
                let req = self.http.post(url).header("content-type", "application/json").body(body);
                let r = self.call(req, &what, true).await?;
                match r.status {
                    200 | 409 => Ok(()),
                    _ => Err(r.error(&what, true)),
                }
            }
            (404, None) => Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "the bucket {} does not exist; create it, or name a project to create it in \
                     (?project=P or GOOGLE_CLOUD_PROJECT)",
                    c.bucket
                ),
            )),
            _ => Err(r.error(&what, false)),
        }
    }
}

#[async_trait::async_trait]
impl Objects for GcsObjects {
    async fn read(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let what = format!("reading gs://{}/{key}", self.config.bucket);
        let r = self.call(self.http.get(format!("{}?alt=media", self.object_url(key))), &what, false).await?;
        match r.status {
            200 => {
                let generation = r.header("x-goog-generation").map(str::to_string).ok_or_else(|| {
                    StoreError::new(ErrorKind::Misconfigured, format!("{what}: the answer carries no generation"))
                })?;
                Ok(Some(Stored { version: generation, body: r.body }))
            }
            404 => Ok(None),
            _ => Err(r.error(&what, false)),
        }
    }

    async fn write(&self, key: &str, at: Option<&str>, _rev: u64, body: &[u8]) -> Result<Option<String>, StoreError> {
        let c = &self.config;
        let what = format!("writing gs://{}/{key}", c.bucket);
        let generation = at.unwrap_or("0");
        if !generation.bytes().all(|b| b.is_ascii_digit()) {
            return Err(StoreError::invalid(format!("{what}: {generation:?} is not a generation number")));
        }
        let url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart&ifGenerationMatch={generation}",
            c.endpoint, c.bucket
        );
        // The media upload ignores preconditions on some emulators; multipart honours them everywhere.
        let boundary = "tenure-lease-record-boundary";
        let meta = serde_json::json!({ "name": key, "contentType": "application/json" }).to_string();
        let mut payload = format!(
            "--{boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n\
             --{boundary}\r\ncontent-type: application/json\r\n\r\n"
        )
        .into_bytes();
        payload.extend_from_slice(body);
        payload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let req =
            self.http.post(url).header("content-type", format!("multipart/related; boundary={boundary}")).body(payload);
        let r = self.call(req, &what, true).await?;
        match r.status {
            200 => {
                let v: serde_json::Value = serde_json::from_slice(&r.body).map_err(|e| {
                    StoreError::ambiguous(format!("{what}: unreadable answer after the write")).with_source(e)
                })?;
                match v["generation"].as_str() {
                    Some(g) => Ok(Some(g.to_string())),
                    None => Err(StoreError::ambiguous(format!("{what}: the answer carries no generation"))),
                }
            }
            412 => Ok(None),
            _ => Err(r.error(&what, true)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>, StoreError> {
        let c = &self.config;
        let what = format!("listing gs://{}/{prefix}", c.bucket);
        let mut names = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut url = format!("{}/storage/v1/b/{}/o?prefix={}", c.endpoint, c.bucket, encode(prefix, false));
            if let Some(p) = &page {
                url.push_str(&format!("&pageToken={}", encode(p, false)));
            }
            let r = self.call(self.http.get(url), &what, false).await?;
            if r.status != 200 {
                return Err(r.error(&what, false));
            }
            let v: serde_json::Value = serde_json::from_slice(&r.body)
                .map_err(|e| StoreError::unavailable(format!("{what}: unreadable answer")).with_source(e))?;
            if let Some(items) = v["items"].as_array() {
                names.extend(items.iter().filter_map(|i| i["name"].as_str().map(str::to_string)));
            }
            page = v["nextPageToken"].as_str().map(str::to_string);
            if page.is_none() {
                break;
            }
        }
        read_each(self, names).await
    }

    fn describe(&self) -> String {
        let c = &self.config;
        format!("gs://{}/{} at {}", c.bucket, c.prefix, c.endpoint)
    }
}
