//! The Redis store against a throwaway server without persistence: the conformance
//! suite (a restart loses every key, and tokens must still grow), the multi-candidate
//! scenario, and clear errors for bad passwords and unreachable servers.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::AcquireRequest;
use tenure::{ElectionName, ErrorKind, HolderId, LeaseStore};
use tenure_redis::RedisStore;
use tenure_testkit::conformance;
use tenure_testkit::harness::{Killer, Opener, Served};
use tenure_testkit::servers::{self, Kind};

/// A throwaway Redis without persistence: a restart loses every key, the token counters
/// included. The scenario's connections are cut by `CLIENT KILL`.
fn redis(open: Opener) -> Option<Served> {
    let kill: Killer = |url| {
        Box::pin(async move {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut c = client.get_multiplexed_async_connection().await.unwrap();
            let _: redis::Value =
                redis::cmd("CLIENT").arg("KILL").arg("SKIPME").arg("yes").query_async(&mut c).await.unwrap();
        })
    };
    Some(Served::direct(Kind::Redis, open, kill)?.not_durable())
}

/// A store with the restart guard off: the conformance suite uses a fresh election per
/// case, and the guard would hold each one back a TTL.
const GUARD_OFF: Opener = |url| {
    Box::pin(async move { Arc::new(RedisStore::connect(&format!("{url}?restart_guard=off")).await.unwrap()) as _ })
};

/// A store with the restart guard on, as the scenario needs: it restarts the server,
/// which comes back without its keys.
const GUARDED: Opener = |url| Box::pin(async move { Arc::new(RedisStore::connect(&url).await.unwrap()) as _ });

tenure_testkit::store_suite! {
    conforms: redis_store_conforms => redis(GUARD_OFF),
    scenario: five_candidates_survive_killed_connections_and_a_restart => redis(GUARDED),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(500),
}

/// Acquires, retrying the errors a restart causes (a broken connection, the guard).
async fn acquire(store: &RedisStore, req: &AcquireRequest) -> tenure::LeaseRecord {
    loop {
        match store.try_acquire(req).await {
            Ok(tenure::store::Acquire::Acquired(l)) => return l,
            Ok(tenure::store::Acquire::Held(r)) => panic!("held by {}", r.holder),
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_that_loses_everything_tokens_grow_and_the_guard_holds() {
    let Some(mut server) = servers::launch(Kind::Redis) else { return };
    let ttl = Duration::from_millis(800);
    let e = ElectionName::new("r/tokens").unwrap();
    let a = AcquireRequest::new(e.clone(), HolderId::new("a").unwrap(), ttl);
    let b = AcquireRequest::new(e.clone(), HolderId::new("b").unwrap(), ttl);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let mut last = acquire(&store, &a).await.token.0;
    for _ in 0..2 {
        // A leader holds the lease; the server restarts and forgets it.
        server.restart();
        let t0 = std::time::Instant::now();
        let lb = acquire(&store, &b).await;
        let waited = t0.elapsed();
        assert!(waited >= ttl, "a new grant came {waited:?} after the data was lost, within one TTL");
        assert!(lb.token.0 > last, "token {} after {last}", lb.token);
        last = lb.token.0;
        store.release(&lb).await.unwrap();
        acquire(&store, &a).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::Redis, Some("right-password")) else { return };
    let bad = format!("redis://:wrong-password@127.0.0.1:{}", server.port());
    let (wrong, right) = (RedisStore::connect(&bad).await.unwrap(), RedisStore::connect(&server.url()).await.unwrap());
    conformance::a_wrong_password_is_refused(&wrong, "wrong-password", "check the password", &right).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = RedisStore::connect(&format!("redis://127.0.0.1:{port}")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, Some("Redis")).await;
}

/// What the scripts publish, parsed, is the record a read returns (but for the time left,
/// which the two measure at different moments), so followers need not read it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_changes_carry_the_stored_record() {
    use tokio_stream::StreamExt;
    let Some(server) = servers::launch(Kind::Redis) else { return };
    let store = RedisStore::connect(&format!("{}?restart_guard=off", server.url())).await.unwrap();
    let client = redis::Client::open(server.url().as_str()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("tenure:changes").await.unwrap();
    let mut messages = pubsub.into_on_message();
    /// A message as the hub sees it: the election, and the record it carries, if it carries
    /// one (`Some(None)`: no lease).
    struct Told {
        election: std::sync::Arc<str>,
        record: Option<Option<tenure::LeaseRecord>>,
    }
    let mut next = async || {
        let m = tokio::time::timeout(Duration::from_secs(5), messages.next()).await.unwrap().unwrap();
        match tenure::store::Change::parse(&m.get_payload::<String>().unwrap()) {
            tenure::store::Change::Election { name, carries } => Told {
                election: name,
                record: match carries {
                    tenure::store::Carries::Record(r) => Some(Some(r)),
                    tenure::store::Carries::NoLease => Some(None),
                    tenure::store::Carries::ReadAgain => None,
                },
            },
            tenure::store::Change::Everything => panic!("a message names its election"),
        }
    };
    let strip = |r: Option<tenure::LeaseRecord>| r.map(|r| tenure::LeaseRecord { remaining: None, ..r });
    let name = ElectionName::new("billing/nightly").unwrap();
    let req = AcquireRequest::new(name.clone(), HolderId::new("web-1.42.ab").unwrap(), Duration::from_secs(9))
        .with_metadata(b"host:8080\t\x00\xff".to_vec());
    let held = acquire(&store, &req).await;
    let told = next().await;
    assert_eq!(&*told.election, "billing/nightly");
    let carried = told.record.expect("the message carries the record");
    assert!(carried.as_ref().and_then(|r| r.remaining).is_some_and(|d| d <= Duration::from_secs(9)));
    assert_eq!(strip(carried), strip(Some(held.clone())));
    let tenure::store::Renew::Renewed(renewed) = store.renew(&held, Duration::from_secs(9)).await.unwrap() else {
        panic!("lost")
    };
    assert_eq!(strip(next().await.record.unwrap()), strip(store.get(&name).await.unwrap()));
    assert_eq!(strip(Some(renewed.clone())), strip(store.get(&name).await.unwrap()));
    store.evict(&name, tenure::Evict::AfterTerm).await.unwrap();
    assert!(next().await.record.unwrap().is_some_and(|r| r.evicted), "an eviction is told with the mark");
    store.evict(&name, tenure::Evict::Now).await.unwrap();
    assert_eq!(next().await.record, Some(None), "an eviction now carries no lease");
}

/// Sends one command to the server behind the store's back.
async fn admin(url: &str, args: &[&str]) {
    let client = redis::Client::open(url).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(&mut c).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_a_failover_or_a_full_server_can_clear_are_retried() {
    let Some(r) = redis(GUARD_OFF) else { return };
    let store = RedisStore::connect(&format!("{}?restart_guard=off", r.url())).await.unwrap();
    let req = |n: &str| AcquireRequest {
        election: ElectionName::new(n).unwrap(),
        holder: HolderId::new("a").unwrap(),
        ttl: Duration::from_secs(5),
        metadata: Vec::new(),
    };
    // What a failover does to the old primary; a primary without its replicas; memory full.
    let faults: [(&[&str], &[&str], &str); 3] = [
        (&["REPLICAOF", "127.0.0.1", "1"], &["REPLICAOF", "NO", "ONE"], "READONLY"),
        (
            &["CONFIG", "SET", "min-replicas-to-write", "1"],
            &["CONFIG", "SET", "min-replicas-to-write", "0"],
            "NOREPLICAS",
        ),
        (&["CONFIG", "SET", "maxmemory", "1"], &["CONFIG", "SET", "maxmemory", "0"], "OOM"),
    ];
    for (i, (set, clear, code)) in faults.iter().enumerate() {
        if *code == "OOM" {
            admin(&r.url(), &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
        }
        let name = format!("refused/{i}");
        let tenure::store::Acquire::Acquired(lease) = store.try_acquire(&req(&name)).await.unwrap() else { panic!() };
        admin(&r.url(), set).await;
        let err = store.renew(&lease, Duration::from_secs(5)).await.expect_err(code);
        assert!(err.kind().is_retryable(), "{code}: {err:?} must be retried, not end the campaign");
        let chain = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(chain.to_lowercase().contains(&code.to_lowercase()), "{chain}");
        admin(&r.url(), clear).await;
        let renewed = store.renew(&lease, Duration::from_secs(5)).await;
        assert!(matches!(renewed, Ok(tenure::store::Renew::Renewed(_))), "{code} cleared: {renewed:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_snapshot_cannot_revive_an_old_term() {
    let Some(r) = redis(GUARD_OFF) else { return };
    let ttl = Duration::from_secs(3);
    let a = RedisStore::connect(&r.url()).await.unwrap();
    let b = RedisStore::connect(&r.url()).await.unwrap();
    let election = ElectionName::new("restored/x").unwrap();
    let req = |h: &str| AcquireRequest::new(election.clone(), HolderId::new(h).unwrap(), ttl);
    // A fresh server grants nothing for one TTL (the restart guard).
    let grant = |s: RedisStore, rq: AcquireRequest| async move {
        loop {
            match s.try_acquire(&rq).await {
                Ok(tenure::store::Acquire::Acquired(l)) => return l,
                Ok(tenure::store::Acquire::Held(h)) => panic!("held by {}", h.holder),
                Err(e) => assert!(e.is_retryable(), "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let old = grant(a.clone(), req("a")).await;
    // A snapshot while a leads; then a hands over to b.
    admin(&r.url(), &["SAVE"]).await;
    let data = r.server().data_dir();
    std::fs::copy(data.join("dump.rdb"), data.join("snapshot.rdb")).unwrap();
    a.release(&old).await.unwrap();
    let new = grant(b.clone(), req("b")).await;
    assert!(new.token > old.token);
    // The server crashes and comes back from the older snapshot: a's record is back.
    {
        let mut s = r.server();
        s.kill();
        std::fs::copy(data.join("snapshot.rdb"), data.join("dump.rdb")).unwrap();
        s.start();
    }
    let mut back = a.get(&election).await;
    for _ in 0..50 {
        if back.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // the client reconnects
        back = a.get(&election).await;
    }
    let back = back.unwrap().expect("the snapshot's record is back");
    assert_eq!((back.holder.as_str(), back.token), ("a", old.token));
    // a finds a record naming it (as after an ambiguous acquire) and confirms it with a
    // renewal, while b still believes it leads until its deadline: that must not succeed.
    match a.renew(&back, ttl).await {
        Ok(tenure::store::Renew::Renewed(l)) => {
            panic!("a restored record renewed: token {} leads again while token {} still believes", l.token, new.token)
        }
        Ok(tenure::store::Renew::Lost(_)) => {}
        Err(e) => assert!(e.is_retryable(), "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restart_guard_lasts_the_longest_ttl_the_candidate_has_seen() {
    let Some(r) = redis(GUARD_OFF) else { return };
    let (long, short) = (Duration::from_secs(4), Duration::from_secs(1));
    let a = RedisStore::connect(&r.url()).await.unwrap();
    let b = RedisStore::connect(&r.url()).await.unwrap();
    let election = ElectionName::new("guard/longest").unwrap();
    let req = |h: &str, ttl| AcquireRequest::new(election.clone(), HolderId::new(h).unwrap(), ttl);
    loop {
        match a.try_acquire(&req("a", long)).await {
            Ok(tenure::store::Acquire::Acquired(_)) => break,
            Ok(tenure::store::Acquire::Held(h)) => panic!("held by {}", h.holder),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // b, with a short TTL, sees a's long lease; then the server forgets it in a restart.
    assert!(matches!(b.try_acquire(&req("b", short)).await, Ok(tenure::store::Acquire::Held(_))));
    r.server().restart();
    let restarted = std::time::Instant::now();
    // a may believe it leads for up to `long` after its last grant: b must wait that out,
    // not just its own short TTL.
    loop {
        match b.try_acquire(&req("b", short)).await {
            Ok(tenure::store::Acquire::Acquired(_)) => break,
            Ok(tenure::store::Acquire::Held(h)) => panic!("held by {}", h.holder),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        restarted.elapsed() >= long,
        "granted {:?} after the restart, within a's {long:?} lease",
        restarted.elapsed()
    );
}

/// Asks `store` for `req` until it is granted (a fresh server's guard refuses at first).
async fn granted(store: &RedisStore, req: &AcquireRequest) -> tenure::LeaseRecord {
    loop {
        match store.try_acquire(req).await {
            Ok(tenure::store::Acquire::Acquired(l)) => return l,
            Ok(tenure::store::Acquire::Held(h)) => panic!("held by {}", h.holder),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_that_lacks_the_newest_grant_grants_nothing_for_the_longest_ttl() {
    // Replication is asynchronous: a replica promoted in a failover may lack the old
    // primary's newest grant, whose holder believes it leads until its deadline.
    let Some(primary) = servers::launch(Kind::Redis) else { return };
    let port = primary.port().to_string();
    let Some(replica) = servers::launch_configured(Kind::Redis, None, &["--replicaof", "127.0.0.1", &port]) else {
        return;
    };
    let (long, short) = (Duration::from_secs(4), Duration::from_secs(1));
    let req =
        |e: &str, h: &str, ttl| AcquireRequest::new(ElectionName::new(e).unwrap(), HolderId::new(h).unwrap(), ttl);
    let a = RedisStore::connect(&primary.url()).await.unwrap();
    // a leads one election with a long TTL, and the replica has it.
    granted(&a, &req("failover/first", "a", long)).await;
    let on_replica = RedisStore::connect(&format!("{}?restart_guard=off", replica.url())).await.unwrap();
    let t0 = std::time::Instant::now();
    while on_replica.get(&ElectionName::new("failover/first").unwrap()).await.ok().flatten().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the replica did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The failover: the replica takes over; the old primary, not yet told, still takes
    // a's grant of another election, which the new primary never sees.
    admin(&replica.url(), &["REPLICAOF", "NO", "ONE"]).await;
    let lost = granted(&a, &req("failover/x", "a", long)).await;
    let lost_at = std::time::Instant::now();
    // b, a new candidate with a short TTL on the new primary, must not be granted while a
    // may still believe: not for the longest TTL in use, though b never saw it.
    let b = RedisStore::connect(&replica.url()).await.unwrap();
    let err = b.try_acquire(&req("failover/x", "b", short)).await.expect_err("granted at once by a promoted replica");
    assert!(err.is_retryable() && err.to_string().contains("failover"), "{err}");
    let mine = granted(&b, &req("failover/x", "b", short)).await;
    let after = lost_at.elapsed();
    assert!(after >= long, "b was granted {after:?} after a's grant (token {}), whose TTL is {long:?}", lost.token);
    assert_ne!(mine.token, lost.token, "a token granted twice");
    // From then on b leads as on any primary.
    assert!(matches!(b.renew(&mine, short).await, Ok(tenure::store::Renew::Renewed(_))));
}

/// A primary makes itself a new replication id, with no failover, when its first
/// replica attaches (it has no backlog yet; a `redis-cli --rdb` backup attaches as a
/// replica too), and again when it frees its backlog long after its last replica left.
/// Same server, same writer: its leaders go on renewing, and it goes on granting. Taken
/// for a takeover, every leader would step down and nothing be granted for a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_attaching_to_a_primary_in_use_does_not_start_the_restart_guard() {
    let Some(primary) = servers::launch(Kind::Redis) else { return };
    let ttl = Duration::from_secs(3);
    let req = |e: &str, h: &str| AcquireRequest::new(ElectionName::new(e).unwrap(), HolderId::new(h).unwrap(), ttl);
    let a = RedisStore::connect(&primary.url()).await.unwrap();
    let held = granted(&a, &req("replica/attach", "a")).await;
    let replid = || {
        let info = servers::redis_command(primary.port(), &["INFO", "replication"]).unwrap_or_default();
        info.lines().find_map(|l| l.strip_prefix("master_replid:")).map(|s| s.trim().to_string())
    };
    let before = replid();
    let port = primary.port().to_string();
    let Some(_replica) = servers::launch_configured(Kind::Redis, None, &["--replicaof", "127.0.0.1", &port]) else {
        return;
    };
    // The leader renews meanwhile, as it would every third of its TTL.
    let t0 = std::time::Instant::now();
    let mut held = held;
    while replid() == before {
        assert!(t0.elapsed() < Duration::from_secs(10), "the primary kept its replication id");
        match a.renew(&held, ttl).await {
            Ok(tenure::store::Renew::Renewed(r)) => held = r,
            other => panic!("the leader could not renew once a replica attached: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let renewed = a.renew(&held, ttl).await;
    assert!(
        matches!(renewed, Ok(tenure::store::Renew::Renewed(_))),
        "the leader could not renew once a replica attached: {renewed:?}"
    );
    let other = a.try_acquire(&req("replica/other", "b")).await;
    assert!(
        matches!(other, Ok(tenure::store::Acquire::Acquired(_))),
        "nothing was granted once a replica attached: {other:?}"
    );
}

/// The server's host vanishes under the store's open connections (nothing answers,
/// nothing resets them) and the server comes back at the same address, as after a
/// failover behind a virtual IP or a DNS name. The store's requests, which time out on
/// the old connection, must go out on a new one; and its watches, whose subscription
/// sends nothing, must notice and subscribe again, or they would miss every release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_vanished_under_open_connections_is_reached_again() {
    use tenure::store::Renew;
    use tenure_testkit::proxy::{Mode, Proxy};
    use tokio_stream::StreamExt;
    let Some(r) = redis(GUARD_OFF) else { return };
    let port = r.server().port();
    let proxy = Proxy::start(("127.0.0.1", port)).unwrap();
    let url = r.url().replacen(&format!(":{port}"), &format!(":{}", proxy.port()), 1);
    let store = RedisStore::connect(&format!("{url}?restart_guard=off")).await.unwrap();
    let other = RedisStore::connect(&format!("{}?restart_guard=off", r.url())).await.unwrap();
    let name = ElectionName::new("vanish/x").unwrap();
    let ttl = Duration::from_secs(60);
    let lease = acquire(&store, &AcquireRequest::new(name.clone(), HolderId::new("a").unwrap(), ttl)).await;
    let mut watch = store.watch(&name).expect("the Redis store watches");
    // A renewal's message, so that the subscription is open before the strand.
    let Ok(Renew::Renewed(renewed)) = store.renew(&lease, ttl).await else { panic!("not renewed") };
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = watch.next().await {
            if event.unwrap().is_some_and(|l| l.revision == renewed.revision) {
                return;
            }
        }
    })
    .await
    .expect("the watch reports the renewal");

    proxy.set(Mode::Strand);
    let mut timed_out = 0;
    let lease = loop {
        match tokio::time::timeout(Duration::from_secs(2), store.renew(&renewed, ttl)).await {
            Ok(Ok(Renew::Renewed(l))) => break l,
            other => {
                timed_out += 1;
                assert!(timed_out <= 3, "renewals were not served again after {timed_out} failed: {other:?}");
            }
        }
    };
    // A reconnection may have the watch read the record again: let that come first (up to
    // 2 s), so that only the subscription can tell of the release that follows.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(event) = watch.next().await {
            if event.is_ok_and(|l| l.is_some_and(|l| l.revision == lease.revision)) {
                return;
            }
        }
    })
    .await;
    // Released by another process: the watch must tell of it.
    other.release(&lease).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = watch.next().await {
            if matches!(event, Ok(None)) {
                return true;
            }
        }
        false
    })
    .await;
    assert!(matches!(heard, Ok(true)), "the watch did not report the release once the connections were stranded");
}

/// What `Batched` asks of a process that leads 10,000 elections: their renewals in one
/// call, then their releases in one. Each must get its own answer; as one pipeline of
/// 10,000 scripts, the call ran past the client's 500 ms per request and failed whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_renewals_and_releases_in_one_call_each_succeed() {
    let Some(r) = redis(GUARD_OFF) else { return };
    let store = RedisStore::connect(&format!("{}?restart_guard=off", r.url())).await.unwrap();
    let ttl = Duration::from_secs(30);
    let holder = HolderId::new("many").unwrap();
    let mut held = Vec::new();
    for i in 0..10_000 {
        let req = AcquireRequest::new(ElectionName::new(format!("many/{i}")).unwrap(), holder.clone(), ttl);
        held.push(acquire(&store, &req).await);
    }
    let renewed = store.renew_many(&held, ttl).await;
    assert_eq!(renewed.len(), held.len());
    for (i, r) in renewed.into_iter().enumerate() {
        match r {
            Ok(tenure::store::Renew::Renewed(rec)) => held[i] = rec,
            other => panic!("renewal {i}: {other:?}"),
        }
    }
    let released = store.release_many(&held).await;
    assert_eq!(released.len(), held.len());
    assert!(released.iter().all(Result::is_ok), "{:?}", released.iter().find(|r| r.is_err()));
    assert!(store.list("many/").await.unwrap().is_empty(), "every election is free again");
}

/// With `min_replicas`, a grant or renewal counts only if that many replicas
/// acknowledged its own write. `WAIT` counts the writes of the connection it goes out on,
/// so the script and its `WAIT` must go out together, on one connection: sent once the
/// script has answered, a `WAIT` could go out on a connection made again in between (the
/// store's connection is shared and remade after a failure), which wrote nothing, and
/// pass at once for a write that no replica has. With the server's answers held back,
/// the `WAIT` must still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_the_wait_for_its_replicas_go_out_together() {
    use tenure_testkit::proxy::{Mode, Proxy};
    let Some(r) = redis(GUARD_OFF) else { return };
    let port = r.server().port();
    let proxy = Proxy::start(("127.0.0.1", port)).unwrap();
    let url = r.url().replacen(&format!(":{port}"), &format!(":{}", proxy.port()), 1);
    let store = RedisStore::connect(&format!("{url}?restart_guard=off&min_replicas=1")).await.unwrap();
    let req = |n: &str| AcquireRequest {
        election: ElectionName::new(n).unwrap(),
        holder: HolderId::new("a").unwrap(),
        ttl: Duration::from_secs(5),
        metadata: Vec::new(),
    };
    // No replica: a grant is never acknowledged, and is not counted.
    let err = store.try_acquire(&req("together/first")).await.expect_err("no replica acknowledged it");
    assert!(err.to_string().contains("replicas"), "{err}");
    let waits = || {
        let stats = servers::redis_command(port, &["INFO", "commandstats"]).unwrap_or_default();
        stats.lines().find_map(|l| l.strip_prefix("cmdstat_wait:calls=")?.split(',').next()?.parse::<u64>().ok())
    };
    let before = waits().unwrap_or(0);
    proxy.set(Mode::HoldAnswers);
    let pending = tokio::spawn({
        let store = store.clone();
        async move { store.try_acquire(&req("together/second")).await }
    });
    let t0 = std::time::Instant::now();
    while waits().unwrap_or(0) <= before {
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the grant's WAIT did not reach the server while the grant's answer was held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set(Mode::Pass);
    let answer = pending.await.unwrap();
    assert!(answer.is_err(), "no replica acknowledged it: {answer:?}");
}

/// A record written by hand that this build cannot read (a holder id with a space, a
/// hash missing its fields) is left out of a listing, not every election with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_no_build_can_read_is_left_out_of_the_list_alone() {
    let Some(server) = servers::launch(Kind::Redis) else { return };
    let store = RedisStore::connect(&format!("{}?restart_guard=off", server.url())).await.unwrap();
    let req = AcquireRequest::new(
        ElectionName::new("jobs/good").unwrap(),
        HolderId::new("a").unwrap(),
        Duration::from_secs(30),
    );
    acquire(&store, &req).await;
    admin(&server.url(), &["HSET", "tenure:lease:jobs/bad", "holder", "x y", "token", "1"]).await;
    admin(&server.url(), &["HSET", "tenure:lease:jobs/shapeless", "colour", "red"]).await;
    let listed = store.list("").await.expect("the readable elections are listed");
    let names: Vec<&str> = listed.iter().map(|r| r.election.as_str()).collect();
    assert_eq!(names, ["jobs/good"]);
    // Reading the bad one itself still says what is wrong.
    let err = store.get(&ElectionName::new("jobs/bad").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Misconfigured, "{err}");
}
