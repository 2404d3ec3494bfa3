//! The etcd store against a throwaway etcd: the conformance suite (restarts included),
//! the multi-candidate scenario, one shared etcd lease per process, and clear errors for
//! bad passwords and unreachable servers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{Acquire, AcquireRequest, ElectionName, ErrorKind, HolderId, LeaseStore, Renew};
use tenure_etcd::EtcdStore;
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct Etcd {
    server: Mutex<Server>,
    /// Clients reach the server through this proxy, so a test can cut their connections.
    proxy: Proxy,
}

impl Etcd {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::Etcd)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        Some(Self { server: Mutex::new(server), proxy })
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.proxy.port())
    }
}

#[async_trait::async_trait]
impl Harness for Etcd {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(EtcdStore::connect(&self.url()).await.unwrap())
    }
    async fn restart(&self) -> bool {
        self.server.lock().unwrap().restart();
        true
    }
    /// etcd leases count whole seconds and last at least two with default settings.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for Etcd {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Harness::open(self).await
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
async fn etcd_store_conforms() {
    let Some(etcd) = Etcd::launch() else { return };
    conformance::run_all(etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(etcd) = Etcd::launch() else { return };
    // etcd looks for expired leases every 500 ms, so a takeover can lag the TTL by that much.
    let r = scenario::multi_candidate(&etcd, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("etcd scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

/// The etcd leases that exist on the server.
async fn leases(url: &str) -> Vec<i64> {
    let ep = url.trim_start_matches("etcd://");
    let mut c = etcd_client::Client::connect([ep], None).await.unwrap();
    c.leases().await.unwrap().leases().iter().map(|l| l.id()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_holds_many_elections_on_one_etcd_lease() {
    let Some(etcd) = Etcd::launch() else { return };
    let store = EtcdStore::connect(&etcd.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let holder = HolderId::new("many").unwrap();
    let mut held = Vec::new();
    for i in 0..50 {
        let e = ElectionName::new(format!("many/{i}")).unwrap();
        match store.try_acquire(&AcquireRequest::new(e, holder.clone(), ttl)).await.unwrap() {
            Acquire::Acquired(l) => held.push(l),
            Acquire::Held(r) => panic!("held by {}", r.holder),
        }
    }
    assert_eq!(leases(&etcd.url()).await.len(), 1, "fifty elections, one etcd lease");
    // Renewing every election keeps each one, still on the one lease.
    for l in &mut held {
        match store.renew(l, ttl).await.unwrap() {
            Renew::Renewed(r) => *l = r,
            Renew::Lost(cur) => panic!("lost {}: {cur:?}", l.election),
        }
    }
    assert_eq!(leases(&etcd.url()).await.len(), 1);
    assert_eq!(store.list("many/").await.unwrap().len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_retryable_and_heals_without_a_restart() {
    let Some(etcd) = Etcd::launch() else { return };
    let store = EtcdStore::connect(&etcd.url()).await.unwrap();
    let e = ElectionName::new("heal").unwrap();
    assert_eq!(store.get(&e).await.unwrap(), None);
    etcd.proxy.set(Mode::Cut);
    let err = store.get(&e).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    etcd.proxy.set(Mode::Pass);
    let mut ok = false;
    for _ in 0..100 {
        if store.get(&e).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the store did not reconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch(Kind::Etcd) else { return };
    let ep = format!("127.0.0.1:{}", server.port());
    {
        let mut c = etcd_client::Client::connect([&ep], None).await.unwrap();
        c.user_add("root", "right-password", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.auth_enable().await.unwrap();
    }
    let store = EtcdStore::connect(&format!("etcd://root:wrong-password@{ep}")).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("check the user and password"), "{err}");
    assert!(!format!("{err:?}").contains("wrong-password"), "the password never shows");
    assert!(!store.describe().contains("password"));
    let good = EtcdStore::connect(&format!("etcd://root:right-password@{ep}")).await.unwrap();
    assert_eq!(good.get(&ElectionName::new("x").unwrap()).await.unwrap(), None);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = EtcdStore::connect(&format!("etcd://127.0.0.1:{port}")).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("etcd"), "{err}");
}
