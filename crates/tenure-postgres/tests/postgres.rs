//! The PostgreSQL store against a throwaway server: the conformance suite (restarts
//! included), the multi-candidate scenario, and clear errors for bad credentials and
//! unreachable servers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::{ElectionName, ErrorKind, LeaseStore};
use tenure_postgres::PostgresStore;
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::scenario::{self, ScenarioHarness};
use tenure_testkit::servers::{self, Kind, Server};

struct Pg {
    server: Mutex<Server>,
    url: String,
}

impl Pg {
    fn launch() -> Option<Self> {
        let server = servers::launch(Kind::Postgres)?;
        let url = server.url();
        Some(Self { server: Mutex::new(server), url })
    }
}

#[async_trait::async_trait]
impl Harness for Pg {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(PostgresStore::connect(&self.url).await.unwrap())
    }
    async fn restart(&self) -> bool {
        self.server.lock().unwrap().restart();
        true
    }
}

#[async_trait::async_trait]
impl ScenarioHarness for Pg {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Harness::open(self).await
    }
    async fn kill_connections(&self) {
        let pool = sqlx::PgPool::connect(&self.url).await.unwrap();
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    async fn restart(&self) {
        self.server.lock().unwrap().restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms() {
    let Some(pg) = Pg::launch() else { return };
    conformance::run_all(pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(pg) = Pg::launch() else { return };
    let r = scenario::multi_candidate(&pg, Duration::from_secs(2), Duration::from_millis(500)).await;
    eprintln!("postgres scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::Postgres, Some("right-password")) else {
        return;
    };
    let bad = format!("postgres://postgres:wrong-password@127.0.0.1:{}/postgres", server.port());
    let store = PostgresStore::connect(&bad).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("check the user and password"), "{err}");
    assert!(!format!("{err:?}").contains("wrong-password"), "the password never shows");
    assert!(!store.describe().contains("password"));
    let good = PostgresStore::connect(&server.url()).await.unwrap();
    assert_eq!(good.get(&ElectionName::new("x").unwrap()).await.unwrap(), None);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await.unwrap();
    let err = store.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("PostgreSQL"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_retried_and_served_again() {
    let Some(pg) = Pg::launch() else { return };
    let store = PostgresStore::connect(&pg.url).await.unwrap();
    let req = tenure::store::AcquireRequest::new(
        ElectionName::new("ro/x").unwrap(),
        tenure::HolderId::new("a").unwrap(),
        Duration::from_secs(10),
    );
    let tenure::store::Acquire::Acquired(lease) = store.try_acquire(&req).await.unwrap() else {
        panic!("not acquired")
    };
    // What a standby does after a failover, or an operator fencing the old primary.
    let admin = sqlx::PgPool::connect(&pg.url).await.unwrap();
    let read_only = |on: bool| {
        let admin = admin.clone();
        async move {
            let set = if on {
                "ALTER SYSTEM SET default_transaction_read_only = on"
            } else {
                "ALTER SYSTEM SET default_transaction_read_only = off"
            };
            sqlx::query(set).execute(&admin).await.unwrap();
            sqlx::query("SELECT pg_reload_conf()").execute(&admin).await.unwrap();
        }
    };
    read_only(true).await;
    let t0 = std::time::Instant::now();
    let err = loop {
        match store.renew(&lease, Duration::from_secs(10)).await {
            Err(e) => break e,
            Ok(_) => assert!(t0.elapsed() < Duration::from_secs(5), "the server never refused"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(err.is_retryable(), "a read-only server must be retried, not end the campaign: {err:?}");
    assert!(err.to_string().contains("no writes"), "{err}");
    read_only(false).await;
    let t0 = std::time::Instant::now();
    loop {
        match store.renew(&lease, Duration::from_secs(10)).await {
            Ok(tenure::store::Renew::Renewed(_)) => break,
            other => assert!(t0.elapsed() < Duration::from_secs(5), "not served again: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
