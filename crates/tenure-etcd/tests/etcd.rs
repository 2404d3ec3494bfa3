//! The etcd store against a throwaway etcd: the conformance suite (restarts included),
//! the multi-candidate scenario, one shared etcd lease per process, and clear errors for
//! bad passwords and unreachable servers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest, Renew};
use tenure::{ElectionName, ErrorKind, HolderId, LeaseStore};
use tenure_etcd::EtcdStore;
use tenure_testkit::conformance::{self, Harness};
use tenure_testkit::harness::{Opener, Served};
use tenure_testkit::proxy::Mode;
use tenure_testkit::scenario;
use tenure_testkit::servers::{self, Kind};

/// A throwaway etcd behind a proxy. Its leases count whole seconds and last at least two
/// with default settings, hence the expiry cases' TTL.
fn etcd() -> Option<Served> {
    let open: Opener = |url| Box::pin(async move { Arc::new(EtcdStore::connect(&url).await.unwrap()) as _ });
    Some(Served::behind_proxy(Kind::Etcd, open)?.short_ttl(Duration::from_secs(2)))
}

// etcd looks for expired leases every 500 ms, so a takeover can lag the TTL by that much.
tenure_testkit::store_suite! {
    conforms: etcd_store_conforms => etcd(),
    scenario: five_candidates_survive_killed_connections_and_a_restart => etcd(),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(1000),
}

/// Runs `etcdctl` (Debian package etcd-client) against `endpoint` and returns what it printed.
fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let program = servers::find_program("etcdctl").expect("etcdctl (Debian package etcd-client) is needed");
    let out = std::process::Command::new(program)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The etcd leases that exist on the server.
fn leases(url: &str) -> Vec<String> {
    let out = etcdctl(url.trim_start_matches("etcd://"), &["lease", "list"]);
    out.lines().skip(1).map(str::to_string).filter(|l| !l.is_empty()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_holds_many_elections_on_one_etcd_lease() {
    let Some(etcd) = etcd() else { return };
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
    assert_eq!(leases(&etcd.url()).len(), 1, "fifty elections, one etcd lease");
    // Renewing every election keeps each one, still on the one lease.
    for l in &mut held {
        match store.renew(l, ttl).await.unwrap() {
            Renew::Renewed(r) => *l = r,
            Renew::Lost(cur) => panic!("lost {}: {cur:?}", l.election),
        }
    }
    assert_eq!(leases(&etcd.url()).len(), 1);
    assert_eq!(store.list("many/").await.unwrap().len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_retryable_and_heals_without_a_restart() {
    let Some(etcd) = etcd() else { return };
    let store = EtcdStore::connect(&etcd.url()).await.unwrap();
    let e = ElectionName::new("heal").unwrap();
    assert_eq!(store.get(&e).await.unwrap(), None);
    etcd.proxy().unwrap().set(Mode::Cut);
    let err = store.get(&e).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    etcd.proxy().unwrap().set(Mode::Pass);
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
    etcdctl(&ep, &["user", "add", "root:right-password", "--interactive=false"]);
    etcdctl(&ep, &["user", "grant-role", "root", "root"]);
    etcdctl(&ep, &["auth", "enable"]);
    let wrong = EtcdStore::connect(&format!("etcd://root:wrong-password@{ep}")).await.unwrap();
    let right = EtcdStore::connect(&format!("etcd://root:right-password@{ep}")).await.unwrap();
    conformance::a_wrong_password_is_refused(&wrong, "wrong-password", "check the user and password", &right).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = EtcdStore::connect(&format!("etcd://127.0.0.1:{port}")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, Some("etcd")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_release_failed_is_not_kept_alive_by_other_renewals() {
    let Some(etcd) = etcd() else { return };
    let store = EtcdStore::connect(&etcd.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let holder = HolderId::new("p").unwrap();
    let grab = |name: &str| AcquireRequest::new(ElectionName::new(name).unwrap(), holder.clone(), ttl);
    let Acquire::Acquired(left) = store.try_acquire(&grab("abandoned/left")).await.unwrap() else { panic!() };
    let Acquire::Acquired(mut kept) = store.try_acquire(&grab("abandoned/kept")).await.unwrap() else { panic!() };
    // The release of one election fails (the connection is cut); this process goes on
    // leading the other, and its renewals keep the process's shared etcd lease alive.
    etcd.proxy().unwrap().set(Mode::Cut);
    assert!(store.release(&left).await.is_err(), "the release went through a cut connection");
    etcd.proxy().unwrap().set(Mode::Pass);
    let other = EtcdStore::connect(&format!("etcd://127.0.0.1:{}", etcd.server().port())).await.unwrap();
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(Renew::Renewed(r)) = store.renew(&kept, ttl).await {
            kept = r;
        }
        let req = AcquireRequest::new(left.election.clone(), HolderId::new("q").unwrap(), ttl);
        if let Acquire::Acquired(_) = other.try_acquire(&req).await.unwrap() {
            break;
        }
        assert!(
            t0.elapsed() < ttl * 3,
            "an election whose release failed was still held {:?} later, kept alive by the process's other renewals",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many transactions the server has handled, from its metrics.
fn transactions(etcd: &Served) -> u64 {
    use std::io::{Read, Write};
    let port = etcd.server().port();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains("grpc_method=\"Txn\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_go_in_batches_and_failed_ones_cost_other_calls_little() {
    let Some(etcd) = etcd() else { return };
    let store = EtcdStore::connect(&etcd.url()).await.unwrap();
    let ttl = Duration::from_secs(10);
    let p = HolderId::new("p").unwrap();
    let mut held = Vec::new();
    for i in 0..400 {
        let req = AcquireRequest::new(ElectionName::new(format!("batch/{i}")).unwrap(), p.clone(), ttl);
        let Acquire::Acquired(l) = store.try_acquire(&req).await.unwrap() else { panic!("batch/{i} is free") };
        held.push(l);
    }
    let (now, later) = held.split_at(200);
    // 200 releases in one call: a few transactions, and every election is free again.
    let before = transactions(&etcd);
    assert!(store.release_many(now).await.iter().all(Result::is_ok));
    let spent = transactions(&etcd) - before;
    assert!(spent <= 3, "200 releases took {spent} transactions");
    assert!(store.get(&now[0].election).await.unwrap().is_none());
    assert!(store.get(&now[199].election).await.unwrap().is_none());
    // 200 releases fail (the connection is cut). The next call, of another election,
    // starts a sweep of them in the background, 100 a transaction, and nothing fails
    // because of them.
    etcd.proxy().unwrap().set(Mode::Cut);
    assert!(store.release_many(later).await.iter().all(Result::is_err), "releases through a cut connection");
    etcd.proxy().unwrap().set(Mode::Pass);
    let fresh = AcquireRequest::new(ElectionName::new("fresh").unwrap(), p.clone(), ttl);
    let before = transactions(&etcd);
    let mut calls = 0;
    loop {
        calls += 1;
        // The connection is made again after the cut: retry what is retryable.
        match store.try_acquire(&fresh).await {
            Ok(a) => break assert!(matches!(a, Acquire::Acquired(_))),
            Err(e) if e.is_retryable() && calls < 10 => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e}"),
        }
    }
    let t0 = std::time::Instant::now();
    while !store.list("batch/").await.unwrap().is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "200 failed releases were not swept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spent = transactions(&etcd) - before;
    assert!(spent <= calls + 4, "{calls} acquires and the sweep of 200 failed releases took {spent} transactions");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_is_retried_and_served_again_once_cleared() {
    // A 64 KiB quota: a few puts fill it and etcd raises its NOSPACE alarm, refusing
    // every write (ResourceExhausted, "database space exceeded") until an operator
    // frees space and disarms the alarm: a refusal that clears, never a fatal one.
    let Some(server) = servers::launch_configured(Kind::Etcd, None, &["--quota-backend-bytes", "65536"]) else {
        return;
    };
    let endpoint = format!("127.0.0.1:{}", server.port());
    let store = EtcdStore::connect(&server.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let req = |name: &str| AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), ttl);
    let Acquire::Acquired(_) = store.try_acquire(&req("full/before")).await.unwrap() else { panic!() };
    let filler = "x".repeat(2000);
    let program = servers::find_program("etcdctl").expect("etcdctl (Debian package etcd-client) is needed");
    let put = |i: usize| {
        std::process::Command::new(&program)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoint}"))
            .args(["put", &format!("filler/{i}"), &filler])
            .output()
            .unwrap()
    };
    let mut i = 0;
    while put(i).status.success() {
        i += 1;
        assert!(i < 1000, "etcd took 2 MB past a 64 KiB quota");
    }
    assert!(etcdctl(&endpoint, &["alarm", "list"]).contains("NOSPACE"));
    let err = match store.try_acquire(&req("full/during")).await {
        Err(e) => e,
        Ok(a) => panic!("a write went through a full database: {a:?}"),
    };
    assert!(err.is_retryable(), "a full database must be retried, not end the campaign: {err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // The operator's remedy: free space, compact, defragment, disarm.
    etcdctl(&endpoint, &["del", "--prefix", "filler/"]);
    let rev = etcdctl(&endpoint, &["endpoint", "status", "-w", "json"]);
    let rev = rev.split("\"revision\":").nth(1).and_then(|r| r.split([',', '}']).next()).unwrap().trim().to_string();
    etcdctl(&endpoint, &["compact", &rev]);
    etcdctl(&endpoint, &["defrag"]);
    etcdctl(&endpoint, &["alarm", "disarm"]);
    let t0 = std::time::Instant::now();
    loop {
        match store.try_acquire(&req("full/during")).await {
            Ok(Acquire::Acquired(_)) => break,
            Ok(other) => panic!("nobody else campaigns, yet: {other:?}"),
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(t0.elapsed() < Duration::from_secs(10), "still refused 10 s after the alarm was disarmed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A three-member cluster: "killing connections" kills one member (in turn) and starts it
/// again; a restart restarts every member, one at a time.
struct Cluster {
    cluster: Mutex<servers::EtcdCluster>,
    next: std::sync::atomic::AtomicUsize,
}

impl Cluster {
    fn launch() -> Option<Self> {
        Some(Self { cluster: Mutex::new(servers::EtcdCluster::launch(3)?), next: Default::default() })
    }
    fn url(&self) -> String {
        self.cluster.lock().unwrap().url()
    }
}

#[async_trait::async_trait]
impl Harness for Cluster {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(EtcdStore::connect(&self.url()).await.unwrap())
    }
    async fn kill_connections(&self) -> bool {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 3;
        let mut c = self.cluster.lock().unwrap();
        c.members[i].kill();
        c.members[i].start();
        true
    }
    async fn restart(&self) -> bool {
        let mut c = self.cluster.lock().unwrap();
        for m in c.members.iter_mut() {
            m.restart();
        }
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_on_a_three_member_cluster_survive_member_kills_and_a_rolling_restart() {
    let Some(cluster) = Cluster::launch() else { return };
    let r = scenario::multi_candidate(&cluster, Duration::from_secs(2), Duration::from_millis(1500)).await;
    eprintln!("etcd cluster scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_requests_are_retried_and_served_again_once_it_is_back() {
    let Some(cluster) = Cluster::launch() else { return };
    let store = EtcdStore::connect(&cluster.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let req = |name: &str| AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), ttl);
    let Acquire::Acquired(_) = store.try_acquire(&req("quorum/before")).await.unwrap() else { panic!() };
    // Two of three members down: the one left has no leader and cannot serve.
    {
        let mut c = cluster.cluster.lock().unwrap();
        c.members[1].kill();
        c.members[2].kill();
    }
    let t0 = std::time::Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < Duration::from_secs(4) {
        let r = tokio::time::timeout(Duration::from_secs(2), store.try_acquire(&req("quorum/during"))).await;
        match r {
            Ok(Ok(a)) => panic!("a write went through without a quorum: {a:?}"),
            Ok(Err(e)) => {
                assert!(e.is_retryable(), "a lost quorum must be retried, not end the campaign: {e}");
                seen.push(e.to_string());
            }
            Err(_) => seen.push("no answer within 2 s".into()),
        }
    }
    assert!(!seen.is_empty());
    eprintln!("without a quorum: {:?}", seen.iter().collect::<std::collections::BTreeSet<_>>());
    {
        let mut c = cluster.cluster.lock().unwrap();
        c.members[1].start();
        c.members[2].start();
    }
    let t0 = std::time::Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_secs(2), store.try_acquire(&req("quorum/during"))).await {
            Ok(Ok(Acquire::Acquired(_))) => break,
            Ok(Ok(other)) => panic!("nobody else campaigns, yet: {other:?}"),
            Ok(Err(e)) => assert!(e.is_retryable(), "{e}"),
            Err(_) => {}
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "still refused 20 s after the quorum came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
