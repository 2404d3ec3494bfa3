//! The MySQL/MariaDB store against a throwaway MariaDB server: the conformance suite
//! (restarts included), the multi-candidate scenario, and clear errors.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;
use tenure::{ElectionName, LeaseStore};
use tenure_mysql::MysqlStore;
use tenure_testkit::conformance;
use tenure_testkit::harness::Served;
use tenure_testkit::servers::{self, Kind};

/// A throwaway MariaDB server; the scenario's connections are cut by the server.
fn my() -> Option<Served> {
    Served::direct(
        Kind::MariaDb,
        |url| Box::pin(async move { Arc::new(MysqlStore::connect(&url).await.unwrap()) as _ }),
        |url| {
            Box::pin(async move {
                let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
                let rows = sqlx::query(
                    "SELECT id FROM information_schema.processlist WHERE id <> CONNECTION_ID() AND user = 'root'",
                )
                .fetch_all(&pool)
                .await
                .unwrap();
                for r in rows {
                    let id: i64 = r.get("id");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}"))).execute(&pool).await;
                }
                pool.close().await;
            })
        },
    )
}

tenure_testkit::store_suite! {
    conforms: mysql_store_conforms => my(),
    scenario: five_candidates_survive_killed_connections_and_a_restart => my(),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(500),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::MariaDb, Some("right-password")) else { return };
    let bad = format!("mysql://root:wrong-password@127.0.0.1:{}/mysql", server.port());
    let (wrong, right) = (MysqlStore::connect(&bad).await.unwrap(), MysqlStore::connect(&server.url()).await.unwrap());
    conformance::a_wrong_password_is_refused(&wrong, "wrong-password", "check the user and password", &right).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = MysqlStore::connect(&format!("mysql://root@127.0.0.1:{port}/mysql")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_retried_and_served_again() {
    let Some(my) = my() else { return };
    // read_only binds users without the privilege to ignore it: a user as applications have.
    let admin = sqlx::MySqlPool::connect(&my.url()).await.unwrap();
    for q in
        ["CREATE USER 'app'@'127.0.0.1' IDENTIFIED BY 'app-pw'", "GRANT ALL PRIVILEGES ON mysql.* TO 'app'@'127.0.0.1'"]
    {
        sqlx::query(q).execute(&admin).await.unwrap();
    }
    let app = my.url().replacen("root@", "app:app-pw@", 1);
    let store = MysqlStore::connect(&app).await.unwrap();
    let req = tenure::store::AcquireRequest::new(
        ElectionName::new("ro/x").unwrap(),
        tenure::HolderId::new("a").unwrap(),
        Duration::from_secs(10),
    );
    let tenure::store::Acquire::Acquired(lease) = store.try_acquire(&req).await.unwrap() else {
        panic!("not acquired")
    };
    // What a replica is after a failover, or an operator fencing the old primary.
    sqlx::query("SET GLOBAL read_only = ON").execute(&admin).await.unwrap();
    let err = store.renew(&lease, Duration::from_secs(10)).await.expect_err("a read-only server took a write");
    assert!(err.is_retryable(), "a read-only server must be retried, not end the campaign: {err:?}");
    assert!(err.to_string().contains("no writes"), "{err}");
    sqlx::query("SET GLOBAL read_only = OFF").execute(&admin).await.unwrap();
    let renewed = store.renew(&lease, Duration::from_secs(10)).await;
    assert!(matches!(renewed, Ok(tenure::store::Renew::Renewed(_))), "not served again: {renewed:?}");
}
