//! The ZooKeeper store against throwaway ZooKeeper servers: the conformance suite
//! (restarts included), the multi-candidate scenario on one server and on a three-member
//! ensemble, expiry judged by the server, TTLs the server would not grant, and clear
//! errors for wrong credentials and unreachable servers.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure::store::{Acquire, AcquireRequest, Renew};
use tenure::{ElectionName, ErrorKind, HolderId, LeaseStore};
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::harness::Served;
use tenure_testkit::proxy::Mode;
use tenure_testkit::scenario;
use tenure_testkit::servers::{self, Kind};
use tenure_zookeeper::ZkStore;

/// A throwaway ZooKeeper server behind a proxy.
fn zk() -> Option<Served> {
    Served::behind_proxy(Kind::ZooKeeper, |url| {
        Box::pin(async move { Arc::new(ZkStore::connect(&url).await.unwrap()) as _ })
    })
}

fn req(name: &str, holder: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new(holder).unwrap(), ttl)
}

// The server expires sessions in whole ticks (100 ms here).
tenure_testkit::store_suite! {
    conforms: zookeeper_store_conforms => zk(),
    scenario: five_candidates_survive_killed_connections_and_a_restart => zk(),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(1000),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_for_longer_than_its_ttl_loses_the_lease_to_the_server_s_expiry() {
    let Some(zk) = zk() else { return };
    let cut_off = ZkStore::connect(&zk.url()).await.unwrap();
    let other = ZkStore::connect(&zk.direct_url()).await.unwrap();
    let ttl = Duration::from_secs(1);
    let sent = Instant::now();
    let Acquire::Acquired(lease) = cut_off.try_acquire(&req("expiry/cut", "a", ttl)).await.unwrap() else { panic!() };
    // The holder's process lives on (its own clean-up would delete the node at the same
    // TTL): silence it so that only the server can end the lease.
    zk.proxy().unwrap().set(Mode::BlackHole);
    let taken = loop {
        match other.try_acquire(&req("expiry/cut", "b", ttl)).await.unwrap() {
            Acquire::Acquired(l) => break l,
            Acquire::Held(r) => assert_eq!(r.holder, lease.holder),
        }
        assert!(sent.elapsed() < ttl * 4, "the server did not expire a silent session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = sent.elapsed();
    assert!(after >= ttl, "another candidate took the lease {after:?} after it was granted for {ttl:?}");
    assert!(taken.token > lease.token);
    zk.proxy().unwrap().set(Mode::Pass);
    // The old holder learns it lost (its session is gone; a new one cannot renew the node).
    let t0 = Instant::now();
    loop {
        match cut_off.renew(&lease, ttl).await {
            Ok(Renew::Lost(cur)) => {
                assert_eq!(cur.map(|c| c.holder), Some(taken.holder.clone()));
                break;
            }
            Ok(Renew::Renewed(r)) => panic!("a lease the server expired was renewed: {r:?}"),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the old holder never heard that it lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("taken over {after:?} after the grant, TTL {ttl:?}");
}

/// A follower's connection is cut and made again, in the same session: its watch must go
/// on telling of changes (the client does not carry persistent watches over to the new
/// connection, so the store adds it again), or followers find out only by polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_s_watch_goes_on_after_its_connection_is_cut_and_made_again() {
    use tokio_stream::StreamExt;
    async fn next(
        w: &mut tenure::store::WatchStream,
    ) -> Option<Result<Option<tenure::LeaseRecord>, tenure::StoreError>> {
        tokio::time::timeout(Duration::from_secs(10), w.next()).await.ok().flatten()
    }
    let Some(zk) = zk() else { return };
    let leader = ZkStore::connect(&zk.direct_url()).await.unwrap();
    let follower = ZkStore::connect(&zk.url()).await.unwrap();
    let e = ElectionName::new("watch/cut").unwrap();
    let mut w = follower.watch(&e).expect("the store watches");
    assert_eq!(w.next().await.unwrap().unwrap(), None, "nobody leads yet");
    let ttl = Duration::from_secs(30);
    let Acquire::Acquired(a) = leader.try_acquire(&req("watch/cut", "a", ttl)).await.unwrap() else { panic!() };
    assert_eq!(next(&mut w).await.unwrap().unwrap().map(|r| r.holder), Some(a.holder.clone()));
    // Cut the follower's connection for well under its session timeout (10 s), then wait
    // until it is served again: the session is the same one.
    zk.proxy().unwrap().set(Mode::Cut);
    tokio::time::sleep(Duration::from_millis(300)).await;
    zk.proxy().unwrap().set(Mode::Pass);
    let t0 = Instant::now();
    while follower.get(&e).await.is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the follower did not reconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The reconnection asked every watcher to re-read; this one, not polled meanwhile,
    // may do it only at its next poll and so tell of the release without any event. The
    // acquire after it can only be told by the watch itself.
    leader.release(&a).await.unwrap();
    loop {
        match next(&mut w).await {
            Some(Ok(None)) => break,
            Some(Ok(Some(r))) => assert_eq!(r.holder, a.holder, "only a led"),
            other => panic!("the watch did not tell of the release after the reconnection: {other:?}"),
        }
    }
    let Acquire::Acquired(b) = leader.try_acquire(&req("watch/cut", "b", ttl)).await.unwrap() else { panic!() };
    match next(&mut w).await {
        Some(Ok(Some(r))) => assert_eq!((r.holder, r.token), (b.holder, b.token)),
        other => panic!("the watch did not tell of the next acquire: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_server_would_not_grant_is_refused_naming_both() {
    let Some(zk) = zk() else { return };
    let store = ZkStore::connect(&zk.url()).await.unwrap();
    // The test server grants session timeouts from 200 ms to 10 minutes.
    for ttl in [Duration::from_millis(150), Duration::from_secs(11 * 60)] {
        // A session of 150 ms gives its handshake 60 ms (the client allows two fifths of
        // the session timeout): on a busy machine it can time out, a retryable error, as a
        // candidate would retry it.
        let mut tries = 0;
        let err = loop {
            tries += 1;
            match store.try_acquire(&req("ttl/bad", "a", ttl)).await {
                Err(e) if e.is_retryable() && tries < 20 => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => break e,
                Ok(a) => panic!("a TTL of {ttl:?} was accepted: {a:?}"),
            }
        };
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{ttl:?}")) && msg.contains("SessionTimeout"), "{msg}");
    }
    assert_eq!(store.get(&ElectionName::new("ttl/bad").unwrap()).await.unwrap(), None);
    // The shortest TTL the server grants: its session, too, can time out on a busy machine.
    for tries in 1.. {
        match store.try_acquire(&req("ttl/bad", "a", Duration::from_millis(200))).await {
            Ok(Acquire::Acquired(_)) => break,
            Err(e) if e.is_retryable() && tries < 20 => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("the shortest TTL the server grants was not: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_holds_many_elections_in_one_session() {
    let Some(zk) = zk() else { return };
    let store = ZkStore::connect(&zk.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let mut held = Vec::new();
    for i in 0..50 {
        match store.try_acquire(&req(&format!("many/{i}"), "many", ttl)).await.unwrap() {
            Acquire::Acquired(l) => held.push(l),
            Acquire::Held(r) => panic!("held by {}", r.holder),
        }
    }
    let answers = store.renew_many(&held, ttl).await;
    assert!(answers.iter().all(|a| matches!(a, Ok(Renew::Renewed(_)))), "{answers:?}");
    assert_eq!(store.list("many/").await.unwrap().len(), 50);
    // Every node belongs to one session: the server holds one session for the process's
    // leases (and one that reads), whatever their number.
    let connections = connections(zk.server().port());
    assert!(connections <= 3, "{connections} connections for 50 elections");
}

/// A follower holds no session but the one it reads and watches through, and a leader
/// that released closes the session its grant was in: an idle session's pings are most of
/// what a ZooKeeper server hears from a candidate that waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_open_no_lease_session_and_a_released_leader_closes_its_own() {
    let Some(zk) = zk() else { return };
    let port = zk.server().port();
    let ttl = Duration::from_secs(3);
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(ZkStore::connect(&zk.url()).await.unwrap());
    }
    let Acquire::Acquired(lease) = stores[0].try_acquire(&req("idle/1", "a", ttl)).await.unwrap() else { panic!() };
    for (s, who) in stores[1..].iter().zip(["b", "c"]) {
        let Acquire::Held(r) = s.try_acquire(&req("idle/1", who, ttl)).await.unwrap() else { panic!() };
        assert_eq!(r.holder.as_str(), "a");
    }
    // The leader's reading and lease sessions, and one reading session for each follower.
    assert_eq!(connections(port), 4, "each follower opened a session of its own");
    stores[0].release(&lease).await.unwrap();
    let closed = async {
        while connections(port) != 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), closed).await.expect("the released lease's session stays open");
    let Acquire::Acquired(_) = stores[1].try_acquire(&req("idle/1", "b", ttl)).await.unwrap() else { panic!() };
    assert_eq!(connections(port), 4);
}

/// A renewal reaches no watcher: it writes the election's renewal node, not the grant
/// node, so a follower hears of a grant's new metadata, its eviction and its end, and is
/// neither woken nor made to read by every renewal. The revision still moves with each
/// renewal, and a read gives the latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_reach_no_watcher_and_what_a_grant_says_does() {
    let Some(zk) = zk() else { return };
    let leader = ZkStore::connect(&zk.url()).await.unwrap();
    let follower = ZkStore::connect(&zk.url()).await.unwrap();
    let ttl = Duration::from_secs(3);
    let e = ElectionName::new("quiet/1").unwrap();
    let Acquire::Acquired(lease) = leader.try_acquire(&req("quiet/1", "a", ttl)).await.unwrap() else { panic!() };
    let mut watch = follower.watch(&e).unwrap();
    // New metadata is heard (again until the watch, which starts on its own, is in place).
    let mut proclaim = req("quiet/1", "a", ttl);
    let mut heard = None;
    for i in 0..50 {
        proclaim.metadata = format!("m{i}").into_bytes();
        let Acquire::Acquired(_) = leader.try_acquire(&proclaim).await.unwrap() else { panic!() };
        if let Some(ev) = next(&mut watch, Duration::from_millis(200)).await {
            heard = Some(ev.expect("the grant vanished"));
            break;
        }
    }
    let heard = heard.expect("the watch never reported new metadata");
    assert_eq!(heard.token, lease.token);
    // The proclamations sent before the watch was in place, heard late.
    let mut held = heard;
    while let Some(ev) = next(&mut watch, Duration::from_millis(300)).await {
        held = ev.unwrap();
    }
    let held_now = leader.get(&e).await.unwrap().unwrap();
    assert_eq!(held_now.metadata, held.metadata);
    let mut held = held_now;
    let mut revision = held.revision;
    for _ in 0..5 {
        let Renew::Renewed(r) = leader.renew(&held, ttl).await.unwrap() else { panic!("lost") };
        assert!(r.revision > revision, "a renewal moves the revision");
        assert_eq!((r.token, &r.metadata), (held.token, &held.metadata));
        revision = r.revision;
        held = r;
    }
    assert_eq!(follower.get(&e).await.unwrap().map(|r| r.revision), Some(revision), "a read gives the latest renewal");
    let listed = follower.list("quiet/").await.unwrap();
    assert_eq!(listed.iter().map(|r| r.revision).collect::<Vec<_>>(), vec![revision]);
    assert!(next(&mut watch, Duration::from_millis(500)).await.is_none(), "a renewal reached the watcher");
    // What the grant says is heard: new metadata, an eviction, its end.
    proclaim.metadata = b"later".to_vec();
    let Acquire::Acquired(now) = leader.try_acquire(&proclaim).await.unwrap() else { panic!() };
    assert!(now.revision > revision);
    let ev = next(&mut watch, Duration::from_secs(5)).await.expect("new metadata unheard").unwrap();
    assert_eq!(ev.metadata, b"later");
    follower.evict(&e, tenure::Evict::AfterTerm).await.unwrap();
    let ev = next(&mut watch, Duration::from_secs(5)).await.expect("the eviction unheard").unwrap();
    assert!(ev.evicted);
    assert!(matches!(leader.renew(&now, ttl).await.unwrap(), Renew::Lost(_)), "an evicted holder renewed");
    follower.evict(&e, tenure::Evict::Now).await.unwrap();
    assert_eq!(next(&mut watch, Duration::from_secs(5)).await, Some(None), "the end unheard");
}

/// The watch's next event within `within`, if any.
async fn next(w: &mut tenure::store::WatchStream, within: Duration) -> Option<Option<tenure::LeaseRecord>> {
    use tokio_stream::StreamExt;
    tokio::time::timeout(within, w.next()).await.ok().flatten().map(Result::unwrap)
}

/// The number of client connections the server reports (its `srvr` command).
fn connections(port: u16) -> usize {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"srvr").unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    // Counts this connection too.
    let n: usize = text.lines().find_map(|l| l.strip_prefix("Connections: ")).unwrap().trim().parse().unwrap();
    n - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error() {
    let Some(zk) = zk() else { return };
    let port = zk.proxy().unwrap().port();
    let good = ZkStore::connect(&format!("zk://tenure:right-password@127.0.0.1:{port}/secured")).await.unwrap();
    let Acquire::Acquired(_) = good.try_acquire(&req("x", "a", Duration::from_secs(5))).await.unwrap() else {
        panic!()
    };
    let bad = ZkStore::connect(&format!("zk://tenure:wrong-password@127.0.0.1:{port}/secured")).await.unwrap();
    let err = bad.get(&ElectionName::new("x").unwrap()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(err.to_string().contains("check the user and password"), "{err}");
    assert!(!format!("{err:?}").contains("wrong-password"), "the password never shows");
    assert!(!bad.describe().contains("password"), "{}", bad.describe());
    let err = bad.try_acquire(&req("y", "b", Duration::from_secs(5))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // Without credentials the path is closed too.
    let anonymous = ZkStore::connect(&format!("zk://127.0.0.1:{port}/secured")).await.unwrap();
    assert_eq!(anonymous.get(&ElectionName::new("x").unwrap()).await.unwrap_err().kind(), ErrorKind::Unauthorized);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = ZkStore::connect(&format!("zk://127.0.0.1:{port}")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, Some("ZooKeeper")).await;
    // An acquire goes through a session of its own, made on demand.
    let err = store.try_acquire(&req("x", "a", Duration::from_secs(2))).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
}

/// A three-member ensemble: "killing connections" kills one member (in turn, the leader
/// first) and starts it again; a restart restarts every member, one at a time.
struct Ensemble {
    ensemble: Mutex<servers::ZkEnsemble>,
    next: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl Harness for Ensemble {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        let url = self.ensemble.lock().unwrap().url();
        Arc::new(ZkStore::connect(&url).await.unwrap())
    }
    async fn kill_connections(&self) -> bool {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut e = self.ensemble.lock().unwrap();
        let i = if n == 0 { e.leader().unwrap_or(0) } else { n % 3 };
        e.members[i].kill();
        e.members[i].start();
        true
    }
    async fn restart(&self) -> bool {
        let mut e = self.ensemble.lock().unwrap();
        for m in e.members.iter_mut() {
            m.restart();
        }
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_on_a_three_member_ensemble_survive_member_kills_and_a_rolling_restart() {
    let Some(ensemble) = servers::ZkEnsemble::launch(3) else { return };
    let h = Ensemble { ensemble: Mutex::new(ensemble), next: Default::default() };
    let r = scenario::multi_candidate(&h, Duration::from_secs(2), Duration::from_millis(1500)).await;
    eprintln!("zookeeper ensemble scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}
