//! The Redis store against a throwaway server without persistence: the conformance
//! suite (a restart loses every key, and tokens must still grow), the multi-candidate
//! scenario, and clear errors for bad passwords and unreachable servers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{AcquireRequest, ElectionName, ErrorKind, HolderId, LeaseStore};
use tenure_redis::RedisStore;
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct R {
    server: Mutex<Server>,
    url: String,
}

impl R {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::Redis)?;
        let url = server.url();
        Some(Self { server: Mutex::new(server), url })
    }
}

#[async_trait::async_trait]
impl Harness for R {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(RedisStore::connect(&self.url).await.unwrap())
    }
    async fn restart(&self) -> bool {
        // Without persistence: the restart loses every key, the token counters included.
        self.server.lock().unwrap().restart();
        true
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for R {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Harness::open(self).await
    }
    async fn kill_connections(&self) {
        let client = redis::Client::open(self.url.as_str()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let _: redis::Value =
            redis::cmd("CLIENT").arg("KILL").arg("SKIPME").arg("yes").query_async(&mut c).await.unwrap();
    }
    async fn restart(&self) {
        self.server.lock().unwrap().restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_conforms() {
    let Some(r) = R::launch() else { return };
    conformance::run_all(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(r) = R::launch() else { return };
    let report = scenario::multi_candidate(&r, Duration::from_secs(2), Duration::from_millis(500)).await;
    eprintln!("redis scenario: {} terms, takeover {:?} after the leader was cut off", report.terms, report.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grow_across_a_restart_that_loses_everything() {
    let Some(mut server) = servers::launch(Kind::Redis) else {
        return;
    };
    let e = ElectionName::new("r/tokens").unwrap();
    let req = AcquireRequest::new(e.clone(), HolderId::new("a").unwrap(), Duration::from_secs(30));
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let tenure::Acquire::Acquired(l) = store.try_acquire(&req).await.unwrap() else { panic!("not acquired") };
        assert!(l.token.0 > last, "token {} after {last}", l.token);
        last = l.token.0;
        server.restart();
        let fresh = RedisStore::connect(&server.url()).await.unwrap();
        assert_eq!(fresh.get(&e).await.unwrap(), None, "the restart lost the lease");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::Redis, Some("right-password")) else {
        return;
    };
    let bad = format!("redis://:wrong-password@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(&bad).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("check the password"), "{err}");
    assert!(!format!("{err:?}").contains("wrong-password"));
    assert!(!store.describe().contains("password"));
    let good = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(good.get(&ElectionName::new("x").unwrap()).await.unwrap(), None);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("Redis"), "{err}");
}
