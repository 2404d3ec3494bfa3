//! The DynamoDB store against a throwaway moto server: the conformance suite, the
//! multi-candidate scenario, and clear errors for bad URLs. moto keeps its tables in
//! memory, so the restart steps are skipped.

use std::sync::Arc;
use std::time::Duration;

use tenure::{ErrorKind, ExpiryJudge, LeaseStore};
use tenure_cloud::{AwsCredentials, DynamoConfig, DynamoStore};
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct Moto {
    _server: Server,
    proxy: Proxy,
}

impl Moto {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::Moto)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        Some(Self { _server: server, proxy })
    }

    async fn open(&self, table: &str) -> Arc<dyn LeaseStore> {
        let config = DynamoConfig {
            table: table.into(),
            region: "eu-west-1".into(),
            endpoint: Some(format!("http://127.0.0.1:{}", self.proxy.port())),
            credentials: AwsCredentials::new("test-key", "test-secret"),
        };
        Arc::new(DynamoStore::connect_with(config).await.unwrap())
    }
}

#[async_trait::async_trait]
impl Harness for Moto {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.open("conformance").await
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for Moto {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.open("scenario").await
    }
    async fn kill_connections(&self) {
        self.proxy.set(Mode::Cut);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.proxy.set(Mode::Pass);
    }
    async fn restart(&self) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_store_conforms() {
    let Some(moto) = Moto::launch() else { return };
    assert_eq!(moto.open("conformance").await.expiry(), ExpiryJudge::ByObserver);
    conformance::run_all(moto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections() {
    let Some(moto) = Moto::launch() else { return };
    let r = scenario::multi_candidate(&moto, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("dynamodb scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[test]
fn bad_urls_give_clear_errors() {
    for (url, says) in [
        ("dynamodb://", "table name"),
        ("dynamodb://a", "table name"),
        ("dynamodb://bad name", "table name"),
        ("dynamodb://leases?x=1", "parameters"),
        ("s3://leases", "not a DynamoDB URL"),
    ] {
        let err = DynamoConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}
