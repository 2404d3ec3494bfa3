//! Choosing a store from a URL.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tenure::LeaseStore;
use tenure::url::redact;

/// The schemes this build supports, for error messages and help.
pub const SCHEMES: &str = "sqlite:PATH, postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?table=NAME], \
                           redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME] (rediss:// for TLS), \
                           redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]/MASTER_NAME, \
                           mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?table=NAME] (or mariadb://), \
                           etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?prefix=NAME] (etcds:// for TLS), \
                           nats://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/BUCKET], \
                           zk://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/PATH], \
                           azblob://ACCOUNT/CONTAINER[/PREFIX], s3://BUCKET[/PREFIX], gs://BUCKET[/PREFIX], \
                           dynamodb://TABLE";

/// Where the default SQLite database lives: `$XDG_STATE_HOME/tenure/tenure.db`, else
/// `~/.local/state/tenure/tenure.db`.
pub fn default_sqlite_path() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let home = std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .context("neither XDG_STATE_HOME nor HOME is set; pass --store sqlite:PATH")?;
            PathBuf::from(home).join(".local/state")
        }
    };
    Ok(base.join("tenure").join("tenure.db"))
}

/// Connects to a store whose crate is behind `feature`, or says which feature is missing.
macro_rules! connect {
    ($feature:literal, $name:literal, $store:path, $url:expr) => {{
        #[cfg(feature = $feature)]
        {
            use $store as Store;
            let store = Store::connect($url)
                .await
                .with_context(|| format!("cannot use the {} store {}", $name, redact($url)))?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = $feature))]
        {
            let _ = $url;
            return Err(missing(concat!("the ", $name, " store"), $feature));
        }
    }};
}

/// Opens the store `url` names, or the default SQLite database when `url` is `None`.
pub async fn open(url: Option<&str>) -> Result<Arc<dyn LeaseStore>> {
    let url = url.map(str::trim).filter(|u| !u.is_empty());
    let path = match url {
        None => {
            let path = default_sqlite_path()?;
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create the state directory {}", dir.display()))?;
            }
            path
        }
        Some(url) => {
            let (scheme, rest) = url
                .split_once(':')
                .with_context(|| format!("store URL {:?} has no scheme; supported: {SCHEMES}", redact(url)))?;
            match scheme {
                "sqlite" => {
                    let path = rest.strip_prefix("//").unwrap_or(rest);
                    if path.is_empty() {
                        bail!("store URL {url:?} names no file; write sqlite:PATH, e.g. sqlite:/var/lib/app/tenure.db");
                    }
                    PathBuf::from(path)
                }
                "postgres" | "postgresql" => connect!("postgres", "PostgreSQL", tenure_postgres::PostgresStore, url),
                "redis" | "rediss" | "redis+sentinel" => connect!("redis", "Redis", tenure_redis::RedisStore, url),
                "mysql" | "mariadb" => connect!("mysql", "MySQL", tenure_mysql::MysqlStore, url),
                "etcd" | "etcds" => connect!("etcd", "etcd", tenure_etcd::EtcdStore, url),
                "nats" => connect!("nats", "NATS", tenure_nats::NatsStore, url),
                "zk" => connect!("zookeeper", "ZooKeeper", tenure_zookeeper::ZkStore, url),
                "azblob" => connect!("cloud", "Azure Blob", tenure_cloud::AzureStore, url),
                "s3" => connect!("cloud", "S3", tenure_cloud::S3Store, url),
                "gs" => connect!("cloud", "GCS", tenure_cloud::GcsStore, url),
                "dynamodb" => connect!("cloud", "DynamoDB", tenure_cloud::DynamoStore, url),
                other => bail!("unknown store scheme {other:?} in {:?}; supported: {SCHEMES}", redact(url)),
            }
        }
    };
    open_sqlite(&path).await
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn LeaseStore>> {
    let store = tenure_sqlite::SqliteStore::open(path)
        .await
        .with_context(|| format!("cannot open the SQLite store at {}", path.display()))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn LeaseStore>> {
    Err(missing("the SQLite store", "sqlite"))
        .with_context(|| format!("cannot open {}: pass --store URL for a store this build has", path.display()))
}

/// The error for a part (`what`: "the PostgreSQL store") this build was compiled without.
#[allow(dead_code)] // unused when every part is built in
pub fn missing(what: &str, feature: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what} is not in this build of tenure: it was built without the `{feature}` feature \
         (cargo install tenure-cli --features {feature}, or build with the default features)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let err = format!("{:#}", open(Some("postgres://app:pw@127.0.0.1/db")).await.err().unwrap());
        assert!(
            err.contains("the PostgreSQL store is not in this build") && err.contains("`postgres` feature"),
            "{err}"
        );
        assert!(!err.contains("pw"), "{err}");
    }

    #[cfg(all(feature = "etcd", feature = "nats", feature = "sqlite"))]
    #[tokio::test]
    async fn unknown_schemes_list_the_supported_ones() {
        let err = open(Some("ftp://x")).await.err().unwrap().to_string();
        assert!(err.contains("unknown store scheme \"ftp\"") && err.contains(SCHEMES), "{err}");
        let err = format!("{:#}", open(Some("etcd://u:pw@h")).await.err().unwrap());
        assert!(!err.contains("pw") && err.contains("needs a port"), "{err}");
        let err = format!("{:#}", open(Some("nats://u:pw@h:4222/a.b")).await.err().unwrap());
        assert!(!err.contains("pw") && err.contains("bucket"), "{err}");
        let err = open(Some("sqlite:")).await.err().unwrap().to_string();
        assert!(err.contains("names no file"), "{err}");
    }
}
