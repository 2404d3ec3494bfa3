//! Opens any tenure lease store from a URL, as the `tenure` command-line tool does:
//! `sqlite:PATH`, `postgres://…`, `mysql://…`, `redis://…` (and `redis+sentinel://`),
//! `etcd://…`, `nats://…`, `zk://…`, `s3://…`, `gs://…`, `dynamodb://…`, `azblob://…`.
//! Each store family is behind a cargo feature of the same name as the CLI's (`sqlite`, the
//! default, `postgres`, `mysql`, `redis`, `etcd`, `nats`, `zookeeper`, `cloud`); a URL
//! of a family left out of the build is refused with an error that names the feature.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // TENURE_STORE, as every replica of the service is given it; else the host-local
//! // SQLite database.
//! let store = tenure_stores::connect_env().await?;
//! let elector = tenure::Elector::builder(store, "billing/nightly").build()?;
//! # Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use tenure::LeaseStore;
use tenure::store::url::redact;
use tenure::store::{ErrorKind, StoreError};

/// One store family: the URL schemes that name it, the form its URLs take (with what
/// else it reads), and the cargo feature that builds it in. [`STORES`] is the one list
/// the help, the errors and [`connect`] go by.
pub struct StoreKind {
    /// Which store it is (what [`connect`] dispatches on).
    pub family: Family,
    /// What the errors call it ("the PostgreSQL store").
    pub name: &'static str,
    /// The schemes that name it.
    pub schemes: &'static [&'static str],
    /// The form of its URLs, and what else it reads.
    pub form: &'static str,
    /// The cargo feature that builds it in (the same name in this crate and the CLI).
    pub feature: &'static str,
}

/// The store families: one arm each in [`connect`], so a family the table names cannot go
/// unopened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `tenure-sqlite`.
    Sqlite,
    /// `tenure-postgres`.
    Postgres,
    /// `tenure-mysql`.
    Mysql,
    /// `tenure-redis`, one server or behind Sentinel.
    Redis,
    /// `tenure-etcd`.
    Etcd,
    /// `tenure-nats`.
    Nats,
    /// `tenure-zookeeper`.
    ZooKeeper,
    /// `tenure-cloud`'s Azure Blob store.
    AzureBlob,
    /// `tenure-cloud`'s S3 store.
    S3,
    /// `tenure-cloud`'s DynamoDB store.
    DynamoDb,
    /// `tenure-cloud`'s GCS store.
    Gcs,
}

/// Every store tenure knows, whether or not this build has it.
pub const STORES: &[StoreKind] = &[
    StoreKind {
        family: Family::Sqlite,
        name: "SQLite",
        schemes: &["sqlite"],
        form: "sqlite:PATH (default: $XDG_STATE_HOME/tenure/tenure.db, else ~/.local/state/tenure/tenure.db)",
        feature: "sqlite",
    },
    StoreKind {
        family: Family::Postgres,
        name: "PostgreSQL",
        schemes: &["postgres", "postgresql"],
        form: "postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?table=NAME] (or postgresql://)",
        feature: "postgres",
    },
    StoreKind {
        family: Family::Mysql,
        name: "MySQL",
        schemes: &["mysql", "mariadb"],
        form: "mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?table=NAME] (or mariadb://)",
        feature: "mysql",
    },
    StoreKind {
        family: Family::Redis,
        name: "Redis",
        schemes: &["redis", "rediss"],
        form: "redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME] (rediss:// for TLS)",
        feature: "redis",
    },
    StoreKind {
        family: Family::Redis,
        name: "Redis",
        schemes: &["redis+sentinel", "rediss+sentinel"],
        form: "redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER_NAME (the primary the sentinels name; \
               rediss+sentinel:// for TLS)",
        feature: "redis",
    },
    StoreKind {
        family: Family::Etcd,
        name: "etcd",
        schemes: &["etcd", "etcds"],
        form: "etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?prefix=NAME] (etcds:// for TLS)",
        feature: "etcd",
    },
    StoreKind {
        family: Family::Nats,
        name: "NATS",
        schemes: &["nats"],
        form: "nats://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/BUCKET] (one TTL per bucket)",
        feature: "nats",
    },
    StoreKind {
        family: Family::ZooKeeper,
        name: "ZooKeeper",
        schemes: &["zk", "zks"],
        form: "zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/PATH], zks://…?ca=PATH for TLS (a TTL within the \
               server's session timeout limits)",
        feature: "zookeeper",
    },
    StoreKind {
        family: Family::AzureBlob,
        name: "Azure Blob",
        schemes: &["azblob"],
        form: "azblob://ACCOUNT/CONTAINER[/PREFIX] (AZURE_STORAGE_CONNECTION_STRING or AZURE_STORAGE_KEY; TTL 15s to 60s)",
        feature: "cloud",
    },
    StoreKind {
        family: Family::S3,
        name: "S3",
        schemes: &["s3"],
        form: "s3://BUCKET[/PREFIX] (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL; \
               ?region=, ?endpoint=)",
        feature: "cloud",
    },
    StoreKind {
        family: Family::DynamoDb,
        name: "DynamoDB",
        schemes: &["dynamodb"],
        form: "dynamodb://TABLE (the same settings as s3://)",
        feature: "cloud",
    },
    StoreKind {
        family: Family::Gcs,
        name: "GCS",
        schemes: &["gs"],
        form: "gs://BUCKET[/PREFIX] (GOOGLE_OAUTH_ACCESS_TOKEN or the metadata server; STORAGE_EMULATOR_HOST; \
               ?project=, ?endpoint=)",
        feature: "cloud",
    },
];

/// The store URL forms, one per line, for help and errors.
pub fn forms() -> String {
    STORES.iter().map(|k| format!("  {}", k.form)).collect::<Vec<_>>().join("\n")
}

/// The environment variable that names the store ([`connect_env`]).
pub const STORE_ENV: &str = "TENURE_STORE";

/// Where the default SQLite database lives: `$XDG_STATE_HOME/tenure/tenure.db`, else
/// `~/.local/state/tenure/tenure.db`.
pub fn default_sqlite_path() -> Result<PathBuf, StoreError> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME").filter(|v| !v.is_empty()).ok_or_else(|| {
                StoreError::invalid("neither XDG_STATE_HOME nor HOME is set: name the store (sqlite:PATH)")
            })?;
            PathBuf::from(home).join(".local/state")
        }
    };
    Ok(base.join("tenure").join("tenure.db"))
}

/// The store a URL names and the rest of it after `scheme:`, checked as far as can be
/// without a connection: a known scheme, `scheme://HOST` for every store but SQLite, a
/// file for SQLite.
pub fn classify(url: &str) -> Result<(&'static StoreKind, &str), StoreError> {
    let (scheme, rest) = url.split_once(':').ok_or_else(|| {
        StoreError::invalid(format!("store URL {:?} has no scheme; supported:\n{}", redact(url), forms()))
    })?;
    let Some(kind) = STORES.iter().find(|k| k.schemes.contains(&scheme)) else {
        return Err(StoreError::invalid(format!(
            "unknown store scheme {scheme:?} in {:?}; supported:\n{}",
            redact(url),
            forms()
        )));
    };
    // Every store but SQLite is `scheme://HOST…`: a URL without it (`postgres:u:pw@h`,
    // `postgres///…`) would reach the client library, which may connect to its
    // default server and send the rest (a password with it) as a database name.
    if kind.family != Family::Sqlite && !rest.strip_prefix("//").is_some_and(|a| !a.is_empty() && !a.starts_with('/')) {
        return Err(StoreError::invalid(format!(
            "store URL {:?} does not start with {scheme}://HOST; supported:\n{}",
            redact(url),
            forms()
        )));
    }
    if kind.family == Family::Sqlite && rest.strip_prefix("//").unwrap_or(rest).is_empty() {
        return Err(StoreError::invalid(format!(
            "store URL {url:?} names no file; write sqlite:PATH, e.g. sqlite:/var/lib/app/tenure.db"
        )));
    }
    Ok((kind, rest))
}

/// The first host `url` names that is not this machine, if the store is reached without
/// TLS that verifies the server: whoever can watch or change that traffic can read the credentials and
/// choose the leader.
pub fn plaintext_remote(url: &str) -> Option<String> {
    let (kind, rest) = classify(url).ok()?;
    let scheme = url.split_once(':').map(|(s, _)| s)?;
    let query = rest.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let param = |name: &str| {
        query.split('&').filter_map(|p| p.split_once('=')).find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v)
    };
    let verified = match kind.family {
        Family::Sqlite => return None,
        Family::Postgres => matches!(param("sslmode"), Some("verify-ca" | "verify-full")),
        Family::Mysql => param("ssl-mode")
            .is_some_and(|m| m.eq_ignore_ascii_case("verify_ca") || m.eq_ignore_ascii_case("verify_identity")),
        Family::Redis => scheme == "rediss" || scheme == "rediss+sentinel",
        Family::Etcd => scheme == "etcds",
        Family::Nats => param("ca").is_some(),
        Family::ZooKeeper => scheme == "zks",
        // HTTPS to the cloud service unless an endpoint says otherwise.
        Family::AzureBlob | Family::S3 | Family::DynamoDb | Family::Gcs => {
            return param("endpoint").filter(|e| e.starts_with("http://")).and_then(|e| {
                let host = e.trim_start_matches("http://").split(['/', '?']).next().unwrap_or_default();
                (!loopback(host)).then(|| host.to_string())
            });
        }
    };
    if verified {
        return None;
    }
    let authority = rest.trim_start_matches("//").split(['/', '?']).next().unwrap_or_default();
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts.split(',').find(|h| !loopback(h)).map(str::to_string)
}

/// Whether `host` (with or without its port) is this machine: `localhost`, 127.0.0.0/8
/// or `::1`.
fn loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host
            .rsplit_once(':')
            .filter(|(h, p)| !h.contains(':') && p.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The error for a store family (`what`: "the PostgreSQL store") this build was compiled
/// without.
pub fn missing(what: &str, feature: &str) -> StoreError {
    StoreError::new(
        ErrorKind::Misconfigured,
        format!(
            "{what} is not in this build: it was built without the `{feature}` feature (build with \
             --features {feature})"
        ),
    )
}

/// Connects to a store of `kind` whose crate is behind `feature` (the same as
/// `kind.feature`), or says which feature is missing.
macro_rules! connect {
    ($feature:literal, $kind:expr, $store:path, $url:expr) => {{
        debug_assert_eq!($kind.feature, $feature);
        #[cfg(feature = $feature)]
        {
            use $store as Store;
            let store = Store::connect($url).await.map_err(|e| {
                StoreError::new(e.kind(), format!("cannot use the {} store {}", $kind.name, redact($url)))
                    .with_source(e)
            })?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = $feature))]
        {
            let _ = $url;
            return Err(missing(&format!("the {} store", $kind.name), $feature));
        }
    }};
}

/// Opens the store `url` names (see the crate's documentation for the forms). A store
/// across a network without TLS that verifies the server is opened, with a warning.
pub async fn connect(url: &str) -> Result<Arc<dyn LeaseStore>, StoreError> {
    let url = url.trim();
    let (kind, rest) = classify(url)?;
    if let Some(host) = plaintext_remote(url) {
        tracing::warn!(
            "the store at {host} is reached without TLS that verifies the server: whoever can watch or \
             change that traffic can read its credentials and choose the leader (see docs/security.md)"
        );
    }
    match kind.family {
        Family::Sqlite => open_sqlite(&PathBuf::from(rest.strip_prefix("//").unwrap_or(rest))).await,
        Family::Postgres => connect!("postgres", kind, tenure_postgres::PostgresStore, url),
        Family::Redis => connect!("redis", kind, tenure_redis::RedisStore, url),
        Family::Mysql => connect!("mysql", kind, tenure_mysql::MysqlStore, url),
        Family::Etcd => connect!("etcd", kind, tenure_etcd::EtcdStore, url),
        Family::Nats => connect!("nats", kind, tenure_nats::NatsStore, url),
        Family::ZooKeeper => connect!("zookeeper", kind, tenure_zookeeper::ZkStore, url),
        Family::AzureBlob => connect!("cloud", kind, tenure_cloud::AzureStore, url),
        Family::S3 => connect!("cloud", kind, tenure_cloud::S3Store, url),
        Family::Gcs => connect!("cloud", kind, tenure_cloud::GcsStore, url),
        Family::DynamoDb => connect!("cloud", kind, tenure_cloud::DynamoStore, url),
    }
}

/// Opens the host-local SQLite database at [`default_sqlite_path`], making its directory
/// (this user's alone) if need be. Replicas on other hosts do not see it: a service on
/// several hosts names a shared store instead.
pub async fn connect_default() -> Result<Arc<dyn LeaseStore>, StoreError> {
    let path = default_sqlite_path()?;
    if let Some(dir) = path.parent() {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let failed = |what: &str, e: std::io::Error| {
            StoreError::new(ErrorKind::Unauthorized, format!("cannot {what} the state directory {}", dir.display()))
                .with_source(e)
        };
        // Only this user's, whatever the umask: the database decides who leads.
        trusted_path(dir)?;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| failed("create", e))?;
        trusted_path(dir)?;
        // One made before, by someone else or open to others, could have its database
        // swapped under this user: refused.
        let meta = std::fs::metadata(dir).map_err(|e| failed("read", e))?;
        if meta.uid() != rustix::process::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
            return Err(StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "the state directory {} is not yours alone (owner uid {}, mode {:o}): others could replace the \
                     database that decides who leads; chown it to this user and chmod 700 it, or name a store",
                    dir.display(),
                    meta.uid(),
                    meta.mode() & 0o777
                ),
            ));
        }
    }
    // Forgetting TENURE_STORE on one host makes it elect itself: say so.
    tracing::info!(
        "store: host-local SQLite ({}): replicas on other hosts do not see these elections; give every \
         replica the same --store (or TENURE_STORE) to elect across hosts",
        path.display()
    );
    open_sqlite(&path).await
}

/// Refuses a path to the state directory that another user could turn elsewhere, and
/// with it the database that decides who leads. The path is followed one name at a time,
/// symbolic links included, as the kernel resolves it: every directory passed through
/// must be this user's or root's and writable by no one else, unless it has the sticky
/// bit (as `/tmp` has); and what is taken from a directory others may write must be this
/// user's or root's (in a sticky directory its owner may still replace it: a link owned
/// by another user in `/tmp` may be pointed elsewhere at any time, even if it leads into
/// this user's own directory today). The state directory itself is checked by the caller;
/// the parts that do not exist yet are made by this user.
fn trusted_path(dir: &std::path::Path) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    use std::path::{Component, Path, PathBuf};
    let me = rustix::process::geteuid().as_raw();
    let ours = |uid: u32| uid == me || uid == 0;
    let refuse = |p: &Path, why: String| {
        Err(StoreError::new(
            ErrorKind::Misconfigured,
            format!(
                "the state directory {} is reached through {}, {why}: another user could swap the database that \
                 decides who leads; set XDG_STATE_HOME to a directory of yours, or name a store",
                dir.display(),
                p.display()
            ),
        ))
    };
    let absolute = match dir.is_absolute() {
        true => dir.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|e| StoreError::invalid("cannot read the working directory").with_source(e))?
            .join(dir),
    };
    let mut pending: std::collections::VecDeque<PathBuf> = std::collections::VecDeque::new();
    let parts = |p: &Path| -> Vec<PathBuf> {
        p.components()
            .filter_map(|c| match c {
                Component::RootDir => Some(PathBuf::from("/")),
                Component::ParentDir => Some(PathBuf::from("..")),
                Component::Normal(n) => Some(PathBuf::from(n)),
                Component::CurDir | Component::Prefix(_) => None,
            })
            .collect()
    };
    pending.extend(parts(&absolute));
    let mut at = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == Path::new("/") {
            at = PathBuf::from("/");
            continue;
        }
        if part == Path::new("..") {
            at.pop();
            continue;
        }
        // `at` holds no link: its metadata is its own.
        let Ok(here) = std::fs::metadata(&at) else { return Ok(()) };
        if !ours(here.uid()) {
            return refuse(&at, format!("a directory owned by uid {}", here.uid()));
        }
        let open = here.mode() & 0o022 != 0;
        if open && here.mode() & 0o1000 == 0 {
            return refuse(
                &at,
                format!("a directory others may write (mode {:o}, no sticky bit)", here.mode() & 0o7777),
            );
        }
        let next = at.join(&part);
        let Ok(meta) = std::fs::symlink_metadata(&next) else { return Ok(()) };
        if open && !ours(meta.uid()) {
            let what = if meta.file_type().is_symlink() { "a symbolic link" } else { "an entry" };
            return refuse(
                &next,
                format!("{what} owned by uid {} in {}, a directory others may write", meta.uid(), at.display()),
            );
        }
        if meta.file_type().is_symlink() {
            links += 1;
            let target = std::fs::read_link(&next).ok().filter(|_| links <= 40);
            let Some(target) = target else { return refuse(&next, "a chain of symbolic links too long".into()) };
            for p in parts(&target).into_iter().rev() {
                pending.push_front(p);
            }
            continue;
        }
        at = next;
    }
    Ok(())
}

/// Opens the store `TENURE_STORE` names, or [`connect_default`]'s when it is unset or
/// empty: what the `tenure` tool opens without `--store`.
pub async fn connect_env() -> Result<Arc<dyn LeaseStore>, StoreError> {
    match std::env::var(STORE_ENV).ok().filter(|u| !u.trim().is_empty()) {
        Some(url) => connect(&url).await,
        None => connect_default().await,
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn LeaseStore>, StoreError> {
    let store = tenure_sqlite::SqliteStore::open(path).await.map_err(|e| {
        StoreError::new(e.kind(), format!("cannot open the SQLite store at {}", path.display())).with_source(e)
    })?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn LeaseStore>, StoreError> {
    Err(StoreError::new(
        ErrorKind::Misconfigured,
        format!("cannot open {}: name a store this build has", path.display()),
    )
    .with_source(missing("the SQLite store", "sqlite")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error and its sources, as the CLI prints them.
    fn chain(e: &StoreError) -> String {
        let mut s = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(c) = source {
            s = format!("{s}: {c}");
            source = c.source();
        }
        s
    }

    #[tokio::test]
    async fn a_url_without_its_host_part_is_refused_before_any_connection() {
        for url in [
            "postgres:u:S3CRET@127.0.0.1:1/db",
            "postgres:///u:S3CRET@127.0.0.1:1/db",
            "mysql:u:S3CRET@127.0.0.1:1/db",
            "redis:S3CRET@127.0.0.1:1",
        ] {
            let err = chain(&connect(url).await.err().expect(url));
            assert!(err.contains("does not start with") && err.contains("://HOST"), "{url}: {err}");
            assert!(!err.contains("S3CRET"), "{url}: {err}");
        }
    }

    #[test]
    fn a_remote_store_without_verified_tls_is_named_and_a_local_or_verified_one_is_not() {
        for (url, warned) in [
            ("sqlite:/tmp/x.db", None),
            ("postgres://u:p@127.0.0.1:5432/db", None),
            ("postgres://u:p@localhost/db", None),
            ("postgres://u:p@db.example:5432/db", Some("db.example:5432")),
            ("postgres://u:p@db.example/db?sslmode=require", Some("db.example")),
            ("postgres://u:p@db.example/db?sslmode=verify-full", None),
            ("mysql://u:p@10.0.0.5/db?ssl-mode=VERIFY_IDENTITY", None),
            ("mysql://u:p@10.0.0.5/db", Some("10.0.0.5")),
            ("redis://:p@[::1]:6379/0", None),
            ("redis://:p@cache.example:6379/0", Some("cache.example:6379")),
            ("rediss://:p@cache.example:6379/0", None),
            ("redis+sentinel://s1.example:26379/m", Some("s1.example:26379")),
            ("rediss+sentinel://s1.example:26379/m?ca=/etc/ca.pem", None),
            ("etcd://127.0.0.1:2379,10.0.0.2:2379", Some("10.0.0.2:2379")),
            ("etcds://10.0.0.2:2379", None),
            ("nats://10.0.0.3:4222", Some("10.0.0.3:4222")),
            ("nats://10.0.0.3:4222?ca=/etc/ca.pem", None),
            ("zk://u:p@zk.example:2181", Some("zk.example:2181")),
            ("zks://u:p@zk.example:2181?ca=/etc/ca.pem", None),
            ("s3://bucket", None),
            ("s3://bucket?endpoint=http://127.0.0.1:9000", None),
            ("s3://bucket?endpoint=http://minio.example:9000", Some("minio.example:9000")),
        ] {
            assert_eq!(plaintext_remote(url).as_deref(), warned, "{url}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(redact("redis://:pw@127.0.0.1:6379"), "redis://:***@127.0.0.1:6379");
        assert_eq!(redact("sqlite:/tmp/a.db"), "sqlite:/tmp/a.db");
        assert_eq!(redact("etcd://h1:2379,h2:2379"), "etcd://h1:2379,h2:2379");
    }

    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn a_store_left_out_of_the_build_is_refused_by_name() {
        let err = chain(&connect("postgres://app:pw@127.0.0.1/db").await.err().unwrap());
        assert!(
            err.contains("the PostgreSQL store is not in this build") && err.contains("`postgres` feature"),
            "{err}"
        );
        assert!(!err.contains("pw"), "{err}");
    }

    #[cfg(all(feature = "etcd", feature = "nats", feature = "sqlite"))]
    #[tokio::test]
    async fn unknown_schemes_list_the_supported_ones() {
        let err = connect("ftp://x").await.err().unwrap().to_string();
        assert!(err.contains("unknown store scheme \"ftp\"") && err.contains(&forms()), "{err}");
        let err = chain(&connect("etcd://u:pw@h").await.err().unwrap());
        assert!(!err.contains("pw") && err.contains("needs a port"), "{err}");
        let err = chain(&connect("nats://u:pw@h:4222/a.b").await.err().unwrap());
        assert!(!err.contains("pw") && err.contains("bucket"), "{err}");
        let err = connect("sqlite:").await.err().unwrap().to_string();
        assert!(err.contains("names no file"), "{err}");
    }
}
