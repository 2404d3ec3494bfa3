//! Where the store's commands go: one server, or the primary that Redis Sentinel names,
//! found again after every failover.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use tenure::{ErrorKind, StoreError};

use crate::{has_code, redis_error};

/// How long finding the primary through the sentinels, or connecting to it, may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// One server, or a primary found through sentinels.
#[allow(clippy::large_enum_variant)] // one per store
pub(crate) enum Target {
    /// One server, always the same address; its connection is made again after a request
    /// on it fails as one to a server that moved would (see [`Target::failed`]). The
    /// connection kept, and how many have been made (its number).
    Direct { client: redis::Client, conn: std::sync::Mutex<(u64, Option<ConnectionManager>)> },
    /// The primary the sentinels name for a master name.
    Sentinel(Sentinel),
}

/// A primary found through sentinels: asked again when the one in use fails or refuses
/// writes (a failover demoted it).
pub(crate) struct Sentinel {
    master: String,
    client: tokio::sync::Mutex<SentinelClient>,
    current: std::sync::Mutex<Option<(redis::Client, ConnectionManager)>>,
    /// A client for each sentinel, asked which primary they name when finding one failed,
    /// to tell a fault of the sentinels from one of the primary they named.
    sentinels: Vec<redis::Client>,
}

/// What a `redis+sentinel://` (or `rediss+sentinel://`) URL names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `rediss+sentinel://`: TLS to the sentinels and to the primary.
    pub tls: bool,
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_password: Option<String>,
    pub db: i64,
}

/// Whether `url` names sentinels (`redis+sentinel://` or `rediss+sentinel://`).
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://")
}

/// The port sentinels listen on unless the URL says otherwise.
const SENTINEL_PORT: u16 = 26379;

/// Parses `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]…]/MASTER_NAME`
/// (`rediss+sentinel://` for TLS) with the optional parameters `db=N` and
/// `sentinel_password=PASSWORD` (our own ones already split off).
pub(crate) fn parse_sentinel_url(url: &str) -> Result<SentinelUrl, StoreError> {
    let bad = |why: &str| {
        StoreError::invalid(format!(
            "{why}: write redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER_NAME[?db=N&sentinel_password=PW] \
             (rediss+sentinel:// for TLS)"
        ))
    };
    let (tls, rest) = match (url.strip_prefix("redis+sentinel://"), url.strip_prefix("rediss+sentinel://")) {
        (Some(rest), _) => (false, rest),
        (None, Some(rest)) => (true, rest),
        (None, None) => return Err(bad("not a redis+sentinel:// URL")),
    };
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, master) = rest.split_once('/').ok_or_else(|| bad("no master name"))?;
    let master = master.trim_end_matches('/');
    if master.is_empty() || master.contains('/') {
        return Err(bad("no master name, or more than one path segment"));
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((user, pw)) => ((!user.is_empty()).then(|| user.to_string()), Some(pw.to_string())),
            None => (Some(u.to_string()), None),
        },
    };
    let mut sentinels = Vec::new();
    for h in hosts.split(',') {
        let (host, port) = match h.rsplit_once(':') {
            Some((host, port)) => {
                (host, port.parse::<u16>().map_err(|_| bad(&format!("port {port:?} of sentinel {h:?} is not a port")))?)
            }
            None => (h, SENTINEL_PORT),
        };
        if host.is_empty() {
            return Err(bad("a sentinel without a host"));
        }
        sentinels.push((host.to_string(), port));
    }
    let (mut db, mut sentinel_password) = (0, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("db", v)) => db = v.parse().map_err(|_| bad(&format!("db={v:?} is not a number")))?,
            Some(("sentinel_password", v)) => sentinel_password = Some(v.to_string()),
            // The name only: a value may be a password.
            _ => {
                let name = pair.split_once('=').map_or(pair, |(k, _)| k);
                return Err(bad(&format!("unknown parameter {name:?} (known: db, sentinel_password)")));
            }
        }
    }
    Ok(SentinelUrl { tls, sentinels, master: master.to_string(), username, password, sentinel_password, db })
}

fn connection_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT)).set_number_of_retries(1)
}

/// The files of `ca=`, `cert=` and `key=` (PEM), for a server reached over TLS.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsFiles {
    /// The certificate authority the server's certificate must chain to (else the
    /// system's roots).
    pub ca: Option<String>,
    /// A client certificate, for a server that asks for one.
    pub cert: Option<String>,
    /// The client certificate's key.
    pub key: Option<String>,
}

impl TlsFiles {
    /// Whether any is given.
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// The files' contents, as the client takes them.
    fn read(&self) -> Result<redis::TlsCertificates, StoreError> {
        use tenure::store::url::{Pem, read_pem};
        let root_cert = self.ca.as_deref().map(|p| read_pem("ca", p, Pem::Certificate)).transpose()?;
        let client_tls = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem("cert", c, Pem::Certificate)?,
                client_key: read_pem("key", k, Pem::Key)?,
            }),
            _ => None,
        };
        Ok(redis::TlsCertificates { client_tls, root_cert })
    }
}

impl Target {
    /// A target for what `url` names: sentinels for `redis+sentinel://` (over TLS to the
    /// sentinels and the primary for `rediss+sentinel://`), else one server (over TLS with
    /// `tls`'s files, if any).
    pub(crate) fn new(url: &str, tls: &TlsFiles) -> Result<(Self, String), StoreError> {
        // rustls needs a process-wide crypto provider; one installed already (by the
        // program, or another store) stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if is_sentinel_url(url) {
            let u = parse_sentinel_url(url)?;
            let addrs: Vec<redis::ConnectionAddr> = u
                .sentinels
                .iter()
                .map(|(h, p)| match u.tls {
                    true => {
                        redis::ConnectionAddr::TcpTls { host: h.clone(), port: *p, insecure: false, tls_params: None }
                    }
                    false => redis::ConnectionAddr::Tcp(h.clone(), *p),
                })
                .collect();
            let files = if u.tls && tls.any() { Some(tls.read()?) } else { None };
            let sentinels = addrs
                .iter()
                .filter_map(|a| {
                    let mut info = redis::IntoConnectionInfo::into_connection_info(a.clone()).ok()?;
                    if let Some(pw) = &u.sentinel_password {
                        let settings = info.redis_settings().clone().set_password(pw);
                        info = info.set_redis_settings(settings);
                    }
                    match &files {
                        Some(f) => redis::Client::build_with_tls(info, f.clone()).ok(),
                        None => redis::Client::open(info).ok(),
                    }
                })
                .collect();
            let mut b = SentinelClientBuilder::new(addrs, &u.master, SentinelServerType::Master)
                .map_err(|e| StoreError::invalid("the sentinel URL is not valid").with_source(e))?
                .set_client_to_redis_db(u.db);
            if u.tls {
                // Verified both ways: the sentinels, and the primary they name.
                b = b
                    .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
                    .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
                if let Some(files) = files {
                    b = b.set_client_to_sentinel_certificates(files.clone()).set_client_to_redis_certificates(files);
                }
            }
            if let Some(user) = &u.username {
                b = b.set_client_to_redis_username(user);
            }
            if let Some(pw) = &u.password {
                b = b.set_client_to_redis_password(pw);
            }
            if let Some(pw) = &u.sentinel_password {
                b = b.set_client_to_sentinel_password(pw);
            }
            let client = b.build().map_err(|e| StoreError::invalid("the sentinel URL is not valid").with_source(e))?;
            let hosts: Vec<String> = u.sentinels.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            let scheme = if u.tls { "rediss+sentinel" } else { "redis+sentinel" };
            let described = format!("{scheme}://{}/{}", hosts.join(","), u.master);
            let target = Target::Sentinel(Sentinel {
                master: u.master.clone(),
                client: tokio::sync::Mutex::new(client),
                current: std::sync::Mutex::new(None),
                sentinels,
            });
            return Ok((target, described));
        }
        let client = if tls.any() { redis::Client::build_with_tls(url, tls.read()?) } else { redis::Client::open(url) }
            .map_err(|e| StoreError::new(ErrorKind::Misconfigured, "the Redis URL is not valid").with_source(e))?;
        let described = format!("redis://{}", client.get_connection_info().addr());
        Ok((Target::Direct { client, conn: std::sync::Mutex::new((0, None)) }, described))
    }

    /// A connection to the server (the current primary, behind sentinels), and its number,
    /// to name it to [`Target::failed`] should a request on it fail.
    pub(crate) async fn conn(&self) -> Result<(u64, ConnectionManager), StoreError> {
        match self {
            Target::Direct { client, conn } => {
                let mut kept = conn.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(c) = &kept.1 {
                    return Ok((kept.0, c.clone()));
                }
                // Made under the lock, and lazily: the manager connects on its first use, in
                // a future of its own that a caller giving up does not cancel, and calls that
                // find no connection at once share the one made.
                let made = client
                    .get_connection_manager_lazy(connection_config())
                    .map_err(|e| redis_error("connecting", e))?;
                kept.0 += 1;
                kept.1 = Some(made.clone());
                Ok((kept.0, made))
            }
            Target::Sentinel(s) => Ok((0, s.primary().await?.1)),
        }
    }

    /// A client for the server (the current primary), for pub/sub.
    pub(crate) async fn client(&self) -> Result<redis::Client, StoreError> {
        match self {
            Target::Direct { client, .. } => Ok(client.clone()),
            Target::Sentinel(s) => Ok(s.primary().await?.0),
        }
    }

    /// Called with every failed request, made on connection number `on` (`None`: not on a
    /// kept one). A server that cannot be reached, does not answer, or refuses writes (a
    /// failover demoted it) is connected to again next time: behind sentinels, to the
    /// primary they name then; on one address, afresh, since the client makes a connection
    /// again only once it has dropped, and one to a host that vanished without a reset
    /// (its address now served by a new host, as after a failover behind a virtual IP or a
    /// DNS name) never drops, nor does one to an old primary that still serves as a
    /// replica. A failure on a connection older than the one kept drops nothing.
    pub(crate) fn failed(&self, on: Option<u64>, e: &redis::RedisError) {
        let moved = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || ["READONLY", "MASTERDOWN", "LOADING"].iter().any(|c| has_code(e, c));
        if !moved {
            return;
        }
        match self {
            Target::Sentinel(s) => *s.current.lock().unwrap_or_else(|p| p.into_inner()) = None,
            Target::Direct { conn, .. } if !crate::mutant("redis-connection-kept") => {
                let mut kept = conn.lock().unwrap_or_else(|p| p.into_inner());
                if on.is_none_or(|n| n == kept.0) {
                    kept.1 = None;
                }
            }
            Target::Direct { .. } => {}
        }
    }
}

impl Sentinel {
    /// The primary in use, or the one the sentinels name now (checked with `ROLE`).
    async fn primary(&self) -> Result<(redis::Client, ConnectionManager), StoreError> {
        if let Some(c) = self.current.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        let found = async {
            let asked = self.client.lock().await.async_get_client().await;
            let client = match asked {
                Ok(c) => c,
                // Also what unreachable sentinels give: retried, with both causes named.
                Err(e) if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel => {
                    return Err(StoreError::unavailable(format!(
                        "no sentinel named a primary for {:?}: check the master name and that the sentinels \
                         run; retrying",
                        self.master
                    ))
                    .with_source(e));
                }
                // The client asks the sentinels, then checks the primary they name with a
                // connection of its own: which of the two failed is asked again here.
                Err(e) => {
                    return Err(match self.named_primary().await {
                        Some(addr) => redis_error(&format!("connecting to the primary {addr} the sentinels named"), e),
                        None => redis_error("finding the primary through the sentinels", e),
                    });
                }
            };
            let conn = client
                .get_connection_manager_with_config(connection_config())
                .await
                .map_err(|e| redis_error("connecting to the primary the sentinels named", e))?;
            Ok::<_, StoreError>((client, conn))
        };
        let found = tokio::time::timeout(CONNECT_TIMEOUT * 2, found).await.map_err(|_| {
            StoreError::unavailable("no sentinel named a primary that answered in time (a failover under way?)")
        })??;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        Ok(found)
    }
}

impl Sentinel {
    /// The address of the primary the sentinels name, if every one of them answers within
    /// [`CONNECT_TIMEOUT`] (asked at once) and they agree: then a failure to find the
    /// primary was the primary's, not theirs. `None` otherwise.
    async fn named_primary(&self) -> Option<String> {
        let mut asked = tokio::task::JoinSet::new();
        for sentinel in &self.sentinels {
            let (sentinel, master) = (sentinel.clone(), self.master.clone());
            asked.spawn(async move {
                let mut conn = sentinel.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
                    .ok()?
            });
        }
        let named = tokio::time::timeout(CONNECT_TIMEOUT, asked.join_all()).await.ok()?;
        let first = named.first()?.clone()?;
        named.iter().all(|n| n.as_ref() == Some(&first)).then(|| format!("{}:{}", first.0, first.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_are_parsed_and_checked() {
        let u =
            parse_sentinel_url("redis+sentinel://:pw@10.0.0.1:26380,10.0.0.2/main?db=2&sentinel_password=s").unwrap();
        assert_eq!(
            u,
            SentinelUrl {
                tls: false,
                sentinels: vec![("10.0.0.1".into(), 26380), ("10.0.0.2".into(), 26379)],
                master: "main".into(),
                username: None,
                password: Some("pw".into()),
                sentinel_password: Some("s".into()),
                db: 2,
            }
        );
        let u = parse_sentinel_url("redis+sentinel://app:pw@h:1/m").unwrap();
        assert_eq!((u.username.as_deref(), u.password.as_deref()), (Some("app"), Some("pw")));
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/m",
            "redis+sentinel://:1/m",
            "redis+sentinel://h:1/m/n",
            "redis+sentinel://h:1/m?tls=yes",
        ] {
            assert_eq!(parse_sentinel_url(bad).err().map(|e| e.kind()), Some(ErrorKind::Invalid), "{bad}");
        }
        // A misspelt password parameter is named, its value never shown.
        let err = parse_sentinel_url("rediss+sentinel://h:1/m?Sentinel_Password=S3CRET").unwrap_err().to_string();
        assert!(err.contains("\"Sentinel_Password\"") && !err.contains("S3CRET"), "{err}");
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz target for the Sentinel URL parser: arbitrary input never panics, and a
    //! refusal never prints a password.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sentinel_urls_never_panic_and_refusals_hide_the_passwords(
            pw in "[a-z]{10}",
            hosts in "[a-z0-9.:,]{0,30}",
            rest in "[ -~]{0,40}",
            any in any::<String>(),
        ) {
            let url = format!("redis+sentinel://u:{pw}@{hosts}{rest}&sentinel_password={pw}");
            if let Err(e) = super::parse_sentinel_url(&url) {
                prop_assert!(!e.to_string().contains(&pw), "{}", e);
            }
            let _ = super::parse_sentinel_url(&any);
        }
    }
}
