//! The Azure Blob lease store against a throwaway Azurite (which checks SharedKey
//! signatures and keeps blobs across restarts): the conformance suite with a restart,
//! the multi-candidate scenario, and clear errors for bad URLs, TTLs and keys.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{AcquireRequest, ElectionName, ErrorKind, ExpiryJudge, HolderId, LeaseStore};
use tenure_cloud::{AzureConfig, AzureStore};
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct Azurite {
    server: Mutex<Server>,
    /// Clients reach Azurite through this proxy, so a test can cut their connections.
    proxy: Proxy,
}

impl Azurite {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::Azurite)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        Some(Self { server: Mutex::new(server), proxy })
    }

    fn config(&self, container: &str) -> AzureConfig {
        let endpoint = format!("http://127.0.0.1:{}/devstoreaccount1", self.proxy.port());
        AzureConfig::emulator(&endpoint, container).unwrap()
    }

    async fn open(&self, container: &str) -> Arc<dyn LeaseStore> {
        Arc::new(AzureStore::connect_with(self.config(container)).await.unwrap())
    }
}

#[async_trait::async_trait]
impl Harness for Azurite {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.open("conformance").await
    }
    async fn restart(&self) -> bool {
        self.server.lock().unwrap().restart();
        true
    }
    // Blob leases last 15 to 60 seconds.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(15)
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for Azurite {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.open("scenario").await
    }
    async fn kill_connections(&self) {
        self.proxy.set(Mode::Cut);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.proxy.set(Mode::Pass);
    }
    async fn restart(&self) {
        self.server.lock().unwrap().restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_store_conforms() {
    let Some(azurite) = Azurite::launch() else { return };
    assert_eq!(azurite.open("conformance").await.expiry(), ExpiryJudge::ByStore);
    conformance::run_all(azurite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(azurite) = Azurite::launch() else { return };
    let r = scenario::multi_candidate(&azurite, Duration::from_secs(15), Duration::from_secs(3)).await;
    eprintln!("azure scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_ttls_and_keys_give_clear_errors() {
    for (url, says) in [
        ("azblob://", "account name"),
        ("azblob://acct", "container name"),
        ("azblob://acct/Bad_Container", "container name"),
        ("azblob://acct/leases/../x", "prefix"),
        ("azblob://acct/leases?x=1", "parameters"),
        ("s3://acct/leases", "not an Azure Blob URL"),
    ] {
        let err = AzureConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let Some(azurite) = Azurite::launch() else { return };
    let store = azurite.open("errors").await;
    let req =
        AcquireRequest::new(ElectionName::new("a").unwrap(), HolderId::new("h").unwrap(), Duration::from_secs(10));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("15 to 60 seconds"), "{err}");
    // A wrong key is refused by the service, and said so.
    let mut wrong = azurite.config("errors");
    wrong.key = vec![7; 64];
    let err = AzureStore::connect_with(wrong).await.err().expect("a wrong key is refused");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
}
