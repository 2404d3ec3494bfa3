//! The PostgreSQL store against a throwaway server: the conformance suite (restarts
//! included), the multi-candidate scenario, and clear errors for bad credentials and
//! unreachable servers.

use std::sync::Arc;
use std::time::Duration;

use tenure::{ElectionName, ErrorKind, LeaseStore};
use tenure_postgres::PostgresStore;
use tenure_testkit::conformance;
use tenure_testkit::harness::Served;
use tenure_testkit::servers::{self, Kind};
use tokio_stream::StreamExt;

/// A throwaway PostgreSQL server; the scenario's connections are cut by the server.
fn pg() -> Option<Served> {
    Served::direct(
        Kind::Postgres,
        |url| Box::pin(async move { Arc::new(PostgresStore::connect(&url).await.unwrap()) as _ }),
        |url| {
            Box::pin(async move {
                let pool = sqlx::PgPool::connect(&url).await.unwrap();
                sqlx::query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
                )
                .execute(&pool)
                .await
                .unwrap();
                pool.close().await;
            })
        },
    )
}

tenure_testkit::store_suite! {
    conforms: postgres_store_conforms => pg(),
    scenario: five_candidates_survive_killed_connections_and_a_restart => pg(),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(500),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::Postgres, Some("right-password")) else { return };
    let bad = format!("postgres://postgres:wrong-password@127.0.0.1:{}/postgres", server.port());
    let wrong = PostgresStore::connect(&bad).await.unwrap();
    let right = PostgresStore::connect(&server.url()).await.unwrap();
    conformance::a_wrong_password_is_refused(&wrong, "wrong-password", "check the user and password", &right).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, Some("PostgreSQL")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_retried_and_served_again() {
    let Some(pg) = pg() else { return };
    let store = PostgresStore::connect(&pg.url()).await.unwrap();
    let req = tenure::store::AcquireRequest::new(
        ElectionName::new("ro/x").unwrap(),
        tenure::HolderId::new("a").unwrap(),
        Duration::from_secs(10),
    );
    let tenure::store::Acquire::Acquired(lease) = store.try_acquire(&req).await.unwrap() else {
        panic!("not acquired")
    };
    // What a standby does after a failover, or an operator fencing the old primary.
    let admin = sqlx::PgPool::connect(&pg.url()).await.unwrap();
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

/// A server host that vanishes (no answer, no reset) while the store holds pooled
/// connections to it, and the server comes back at the same address (a failover to a new
/// host): each call on a stranded connection times out and that connection is closed, so
/// the pools open new ones. Were a timed-out call's connection given back (sqlx checks it
/// with a ping that has no timeout), it would hold its pool slot for good, and once every
/// slot was held no call would be served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_vanished_server_do_not_hold_the_pools() {
    use tenure_testkit::proxy::{Mode, Proxy};
    let Some(pg) = pg() else { return };
    let port = pg.server().port();
    let proxy = Proxy::start(("127.0.0.1", port)).unwrap();
    let url = pg.url().replace(&format!(":{port}/"), &format!(":{}/", proxy.port()));
    let store = PostgresStore::connect(&url).await.unwrap();
    let name = ElectionName::new("vanish/x").unwrap();
    let req =
        tenure::store::AcquireRequest::new(name.clone(), tenure::HolderId::new("a").unwrap(), Duration::from_secs(60));
    let tenure::store::Acquire::Acquired(lease) = store.try_acquire(&req).await.unwrap() else {
        panic!("not acquired")
    };
    let ttl = Duration::from_secs(60);
    // A watch: its LISTEN connection goes through the proxy too.
    let mut watch = store.watch(&name).expect("the PostgreSQL store watches");
    let first = tokio::time::timeout(Duration::from_secs(10), watch.next()).await.expect("the watch reports");
    assert!(first.unwrap().unwrap().is_some_and(|l| l.token == lease.token));
    // A notification, so that the LISTEN connection is open before the strand.
    let tenure::store::Renew::Renewed(renewed) = store.renew(&lease, ttl).await.unwrap() else { panic!("not renewed") };
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = watch.next().await {
            if event.unwrap().is_some_and(|l| l.revision == renewed.revision) {
                return;
            }
        }
    })
    .await
    .expect("the watch reports the renewal");
    let lease = renewed;

    // Every slot of both pools holds a connection: calls that all wait for their answers
    // at once each need one of their own (4 for reads and acquires, 2 for renewals).
    proxy.set(Mode::HoldAnswers);
    let mut calls = Vec::new();
    for _ in 0..4 {
        let (store, name) = (store.clone(), name.clone());
        calls.push(tokio::spawn(async move { store.get(&name).await.map(drop) }));
    }
    for _ in 0..2 {
        let (store, lease) = (store.clone(), lease.clone());
        calls.push(tokio::spawn(async move { store.renew(&lease, ttl).await.map(drop) }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.set(Mode::Pass);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    // sqlx checks each connection given back with a ping of its own, after the call has
    // its answer. A strand that caught those pings would hold the slots for good (see
    // `Pooled`), which no call of ours can prevent: let them finish first.
    tokio::time::sleep(Duration::from_millis(200)).await;

    proxy.set(Mode::Strand);
    // A call that nothing times (a batch, a watch's read) ends too, as ambiguous, once
    // its statement has gone unanswered for 5 s: it does not wait for the kernel.
    let t0 = std::time::Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(15), store.renew(&lease, ttl))
        .await
        .expect("a call on a stranded connection ends by itself")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Ambiguous, "{err:?}");
    assert!(t0.elapsed() >= Duration::from_secs(4), "{:?}: ended before the limit", t0.elapsed());
    let limit = Duration::from_secs(2);
    // Renewals (2 slots) and reads (4 slots): each is served again within one call per
    // stranded connection, and stays served.
    let mut timed_out = 0;
    loop {
        match tokio::time::timeout(limit, store.renew(&lease, ttl)).await {
            Ok(r) => {
                assert!(matches!(r.unwrap(), tenure::store::Renew::Renewed(_)));
                break;
            }
            Err(_) => timed_out += 1,
        }
        assert!(timed_out <= 1, "renewals were not served again after {timed_out} more timed out");
    }
    let mut timed_out = 0;
    loop {
        match tokio::time::timeout(limit, store.get(&name)).await {
            Ok(r) => {
                assert_eq!(r.unwrap().map(|l| l.token), Some(lease.token));
                break;
            }
            Err(_) => timed_out += 1,
        }
        assert!(timed_out <= 4, "reads were not served again after {timed_out} timed out");
    }
    let mut held = lease.clone();
    for _ in 0..5 {
        let renewed = tokio::time::timeout(limit, store.renew(&held, ttl)).await.expect("renewals stay served");
        let tenure::store::Renew::Renewed(l) = renewed.unwrap() else { panic!("not renewed") };
        held = l;
        tokio::time::timeout(limit, store.get(&name)).await.expect("reads stay served").unwrap();
    }

    // The watch's LISTEN connection was stranded too, and a LISTEN sends nothing while it
    // waits: a quiet feed is asked to answer a statement, found out, and opened again, so
    // a release is heard (not only, much later, its expiry).
    let direct = PostgresStore::connect(&pg.url()).await.unwrap();
    direct.release(&held).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = watch.next().await {
            if matches!(event, Ok(None)) {
                return;
            }
        }
        panic!("the watch ended");
    })
    .await;
    assert!(heard.is_ok(), "the watch did not report the release within 20 s");
}

/// A batch of renewals is read once, whatever the table's statistics say. The planner
/// judges `expires_at > now()` from the column's histogram, whose newest deadline is a
/// TTL after the last ANALYZE: a few seconds later it believes no lease is live, and with
/// the expiry judged by `now()` it joined 120,000 rows to a batch of 1,808 by reading the
/// whole batch again for every live row (2.7 s of server time for 10,000 live rows;
/// renewals missed their request timeout and 10,000 elections in one process lost
/// 1,808 terms at once). Here every lease is expired when the table is analysed and
/// 2,000 are made live after; the batch must be read once and every lease renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_batch_is_read_once_however_stale_the_statistics() {
    let Some(pg) = pg() else { return };
    let store = PostgresStore::connect(&format!("{}?table=stale_stats", pg.url())).await.unwrap();
    store.ensure_schema().await.unwrap();
    let pool = sqlx::PgPool::connect(&pg.url()).await.unwrap();
    sqlx::raw_sql(
        "ALTER TABLE stale_stats SET (autovacuum_enabled = false);
         ALTER TABLE stale_stats DISABLE TRIGGER stale_stats_notify;
         INSERT INTO stale_stats (election, holder, token, revision, ttl_ms, expires_at)
           SELECT 'stale/' || i, 'h' || i, 1, 1, 60000, now() - interval '1 hour' FROM generate_series(1, 120000) i;
         ANALYZE stale_stats;
         UPDATE stale_stats SET expires_at = now() + interval '1 hour' WHERE split_part(election, '/', 2)::int <= 2000;
         ALTER TABLE stale_stats ENABLE TRIGGER stale_stats_notify;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let live = store.list("stale/").await.unwrap();
    assert_eq!(live.len(), 2000, "the live leases");
    let held = &live[..1808];

    // The plan, run (and rolled back) with the statement and a batch as the store sends them.
    let mut tx = pool.begin().await.unwrap();
    let explain = format!("EXPLAIN (ANALYZE, TIMING OFF) {}", store.renew_many_statement());
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(held.iter().map(|l| l.election.to_string()).collect::<Vec<_>>())
        .bind(held.iter().map(|l| l.holder.to_string()).collect::<Vec<_>>())
        .bind(held.iter().map(|l| l.token.0 as i64).collect::<Vec<_>>())
        .bind(60_000i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let scans: Vec<&String> = plan.iter().filter(|l| l.contains("Function Scan")).collect();
    assert!(!scans.is_empty(), "no scan of the batch in the plan:\n{}", plan.join("\n"));
    for scan in scans {
        assert!(scan.contains("loops=1)"), "the batch is read more than once:\n{}", plan.join("\n"));
    }

    // The statement still refuses a lease that has expired (its clock is not the planner's).
    sqlx::query("UPDATE stale_stats SET expires_at = now() - interval '1 second' WHERE election = $1")
        .bind(held[0].election.as_str())
        .execute(&pool)
        .await
        .unwrap();
    let renewed = store.renew_many(held, Duration::from_secs(60)).await;
    assert!(
        matches!(renewed[0], Ok(tenure::store::Renew::Lost(None))),
        "an expired lease is not renewed: {:?}",
        renewed[0]
    );
    let all = renewed[1..].iter().filter(|r| matches!(r, Ok(tenure::store::Renew::Renewed(_)))).count();
    assert_eq!(all, held.len() - 1, "every live lease in the batch is renewed");
    pool.close().await;
}

/// A renewal never moves a live lease's expiry earlier. A batch's transaction begins
/// (its `now()`), then waits on the lock of one of its rows; the holder of another lease
/// in it gives up on the batch and renews again, and that renewal commits; then the
/// batch goes on and reaches that lease. Written as its own `now() + ttl`, the batch's
/// grant would end before the one the holder now dates its term from (by as long as the
/// batch waited: seconds when a batch is slow), and another candidate could take the
/// lease while the holder still leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_batch_does_not_shorten_a_renewal_made_after_it_began() {
    use tenure::store::{Acquire, AcquireRequest, Renew};
    let Some(pg) = pg() else { return };
    let store = PostgresStore::connect(&pg.url()).await.unwrap();
    let ttl = Duration::from_secs(60);
    let holder = tenure::HolderId::new("a").unwrap();
    let mut held = Vec::new();
    for name in ["late/w", "late/x"] {
        let req = AcquireRequest::new(ElectionName::new(name).unwrap(), holder.clone(), ttl);
        let Acquire::Acquired(l) = store.try_acquire(&req).await.unwrap() else { panic!("not acquired") };
        held.push(l);
    }
    let pool = sqlx::PgPool::connect(&pg.url()).await.unwrap();
    let expiry = async |name: &str| -> f64 {
        sqlx::query_scalar("SELECT extract(epoch FROM expires_at)::float8 FROM tenure_leases WHERE election = $1")
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    // Another transaction holds late/w's row, so the batch stops there.
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM tenure_leases WHERE election = 'late/w' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let batch = tokio::spawn({
        let (store, held) = (store.clone(), held.clone());
        async move { store.renew_many(&held, ttl).await }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE tenure_leases AS l%'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the batch waits on the locked row");

    // late/x renewed again on its own, after the batch began.
    let Renew::Renewed(_) = store.renew(&held[1], ttl).await.unwrap() else { panic!("not renewed") };
    let renewed_alone = expiry("late/x").await;
    blocker.commit().await.unwrap();
    let answers = batch.await.unwrap();
    assert!(answers.iter().all(|a| matches!(a, Ok(Renew::Renewed(_)))), "the batch renews both: {answers:?}");
    let after_batch = expiry("late/x").await;
    assert!(
        after_batch >= renewed_alone,
        "the late batch moved late/x's expiry {:.3} s earlier than the renewal made after it began",
        renewed_alone - after_batch
    );
    pool.close().await;
}
