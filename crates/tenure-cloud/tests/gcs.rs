//! The GCS store against a throwaway fake-gcs-server (filesystem backend, so restarts
//! keep the objects): the conformance suite with a restart, the multi-candidate
//! scenario, and clear errors for bad URLs and missing buckets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{ErrorKind, ExpiryJudge, LeaseStore};
use tenure_cloud::{GcsAuth, GcsConfig, GcsStore};
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct FakeGcs {
    server: Mutex<Server>,
    /// Clients reach the server through this proxy, so a test can cut their connections.
    proxy: Proxy,
}

impl FakeGcs {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::FakeGcs)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        Some(Self { server: Mutex::new(server), proxy })
    }

    fn config(&self, bucket: &str, project: Option<&str>) -> GcsConfig {
        GcsConfig {
            bucket: bucket.into(),
            prefix: "tenure".into(),
            endpoint: format!("http://127.0.0.1:{}", self.proxy.port()),
            project: project.map(str::to_string),
            auth: GcsAuth::None,
        }
    }

    async fn open(&self, bucket: &str) -> Arc<dyn LeaseStore> {
        Arc::new(GcsStore::connect_with(self.config(bucket, Some("test-project"))).await.unwrap())
    }
}

#[async_trait::async_trait]
impl Harness for FakeGcs {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        self.open("conformance").await
    }
    async fn restart(&self) -> bool {
        self.server.lock().unwrap().restart();
        true
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for FakeGcs {
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
async fn gcs_store_conforms() {
    let Some(gcs) = FakeGcs::launch() else { return };
    assert_eq!(gcs.open("conformance").await.expiry(), ExpiryJudge::ByObserver);
    conformance::run_all(gcs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(gcs) = FakeGcs::launch() else { return };
    let r = scenario::multi_candidate(&gcs, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("gcs scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_missing_buckets_give_clear_errors() {
    for (url, says) in [
        ("gs://", "bucket name"),
        ("gs://UPPER", "bucket name"),
        ("gs://bucket/a//../b", "prefix"),
        ("gs://bucket?x=1", "parameters"),
        ("s3://bucket", "not a GCS URL"),
    ] {
        let err = GcsConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let Some(gcs) = FakeGcs::launch() else { return };
    let err = GcsStore::connect_with(gcs.config("no-such-bucket", None)).await.err().expect("no bucket, no project");
    assert_eq!(err.kind(), ErrorKind::Misconfigured);
    assert!(err.to_string().contains("does not exist"), "{err}");
}
