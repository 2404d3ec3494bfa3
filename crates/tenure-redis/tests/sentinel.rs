//! The Redis store behind Sentinel (`redis+sentinel://`), against a throwaway primary, a
//! replica and three sentinels: it finds the primary through the sentinels, follows
//! failovers (forced, and a killed primary), and after each one grants nothing for the
//! longest TTL in use, since the promoted replica may lack the newest grants. The same
//! over TLS (`rediss+sentinel://`), verified against a private CA.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure::store::{Acquire, AcquireRequest, Renew};
use tenure::{ElectionName, HolderId, LeaseStore};
use tenure_redis::RedisStore;
use tenure_testkit::harness::Harness;
use tenure_testkit::scenario;
use tenure_testkit::servers::{RedisSentinels, SentinelTls, redis_command};

struct S(Mutex<RedisSentinels>, String);

#[async_trait::async_trait]
impl Harness for S {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(RedisStore::connect(&self.1).await.unwrap())
    }
    async fn kill_connections(&self) -> bool {
        let port = self.0.lock().unwrap().primary_port().unwrap();
        redis_command(port, &["CLIENT", "KILL", "TYPE", "normal"]);
        true
    }
    /// A crash of the primary: the sentinels promote the replica; the old primary comes
    /// back as a replica of the new one.
    async fn restart(&self) -> bool {
        let g = &self.0;
        tokio::task::block_in_place(|| {
            let mut g = g.lock().unwrap();
            let old = g.primary_port().unwrap();
            g.primary().kill();
            g.wait_for_new_primary(old);
            g.nodes.iter_mut().find(|n| n.port() == old).unwrap().start();
            g.wait_settled();
        });
        true
    }
}

fn req(e: &str, h: &str, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(ElectionName::new(e).unwrap(), HolderId::new(h).unwrap(), ttl)
}

/// Asks until granted, taking retryable errors (a failover, the guard) as "not yet".
async fn granted(store: &RedisStore, r: &AcquireRequest, within: Duration) -> tenure::LeaseRecord {
    let t0 = Instant::now();
    loop {
        match store.try_acquire(r).await {
            Ok(Acquire::Acquired(l)) => return l,
            Ok(Acquire::Held(h)) => panic!("held by {}", h.holder),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(t0.elapsed() < within, "not granted within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_a_killed_primary_and_killed_connections() {
    let Some(g) = RedisSentinels::launch() else { return };
    let url = g.url();
    let h = S(Mutex::new(g), url);
    let report = scenario::multi_candidate(&h, Duration::from_secs(2), Duration::from_millis(500)).await;
    eprintln!("sentinel scenario: {} terms, takeover {:?} after the leader was cut off", report.terms, report.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_follows_a_failover_and_grants_nothing_while_a_leader_from_before_may_believe() {
    let Some(g) = RedisSentinels::launch() else { return };
    let ttl = Duration::from_secs(3);
    let a = RedisStore::connect(&g.url()).await.unwrap();
    assert!(a.describe().starts_with("redis+sentinel://127.0.0.1:"), "{}", a.describe());
    let lease = granted(&a, &req("sentinel/x", "a", ttl), Duration::from_secs(20)).await;
    // a leads and renews every half second, as a leader does, through the failover; it
    // believes it leads until its last successful renewal's send time plus the TTL.
    let renewer = {
        let (a, lease) = (a.clone(), lease.clone());
        tokio::spawn(async move {
            let mut last_sent = Instant::now();
            loop {
                let sent = Instant::now();
                match a.renew(&lease, ttl).await {
                    Ok(Renew::Renewed(_)) => last_sent = sent,
                    // The new primary, found through the sentinels, lacks renewals the old one
                    // took after the promotion: the lease may have run out there. a's term
                    // ends; it still believed until its last renewal plus the TTL.
                    Ok(Renew::Lost(_)) => return (last_sent, None),
                    // Or it holds the record but does not renew one from before the failover
                    // until the guard is over.
                    Err(e) if e.to_string().contains("failover") => return (last_sent, Some(e)),
                    Err(e) => assert!(e.is_retryable(), "{e}"),
                }
                if sent.duration_since(last_sent) >= ttl {
                    return (last_sent, None); // its term ran out while the deployment moved
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    // A forced failover: the replica is promoted; the old primary becomes its replica.
    let before = g.primary_port().unwrap();
    let after = tokio::task::block_in_place(|| g.failover());
    assert_ne!(before, after);
    let (a_believes_until, err) = renewer.await.unwrap();
    let a_believes_until = a_believes_until + ttl;
    assert!(err.is_none_or(|e| e.is_retryable()));
    // Another candidate, new to this deployment and with a shorter TTL, is granted only
    // once a no longer believes.
    let b = RedisStore::connect(&g.url()).await.unwrap();
    granted(&b, &req("sentinel/y", "b", Duration::from_secs(1)), Duration::from_secs(20)).await;
    let now = Instant::now();
    assert!(now >= a_believes_until, "b granted {:?} before a's belief ended", a_believes_until - now);
    // And from then on the deployment serves as before: tokens grow, and renewals go
    // through (one the resyncing replica did not acknowledge in time is retried within
    // the lease's TTL, as the runtime retries it).
    let l2 = granted(&a, &req("sentinel/x", "a", ttl), Duration::from_secs(20)).await;
    assert!(l2.token > lease.token, "token {} after {}", l2.token, lease.token);
    let since = Instant::now();
    let renewed = loop {
        let r = a.renew(&l2, ttl).await;
        match &r {
            Err(e) if e.is_retryable() && since.elapsed() < ttl / 2 => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            _ => break r,
        }
    };
    assert!(matches!(renewed, Ok(Renew::Renewed(_))), "{renewed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_master_names_and_unreachable_sentinels_are_clear_retryable_errors() {
    let Some(g) = RedisSentinels::launch() else { return };
    let wrong = g.url().replace("/tenure", "/nosuchmaster");
    let store = RedisStore::connect(&wrong).await.unwrap();
    let err = store.try_acquire(&req("sentinel/z", "a", Duration::from_secs(1))).await.expect_err("no primary");
    assert!(err.is_retryable() && err.to_string().contains("nosuchmaster"), "{err}");
    let port = tenure_testkit::servers::free_port();
    let store = RedisStore::connect(&format!("redis+sentinel://127.0.0.1:{port}/tenure")).await.unwrap();
    let err = store.try_acquire(&req("sentinel/z", "a", Duration::from_secs(1))).await.expect_err("no sentinel");
    assert!(err.is_retryable(), "{err}");
    for bad in ["redis+sentinel://127.0.0.1:1", "redis+sentinel://127.0.0.1:x/m", "redis+sentinel://h:1/m?tls=1"] {
        let e = RedisStore::connect(bad).await.err().expect(bad);
        assert_eq!(e.kind(), tenure::ErrorKind::Invalid, "{bad}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_its_replicas_grants_nothing() {
    // A primary without a replica (a demoted primary not yet told, one restarted empty
    // before the sentinels demote it, or one whose replicas are all gone) could grant next
    // to the primary the sentinels promoted: behind Sentinel a grant must reach a replica.
    let Some(mut g) = RedisSentinels::launch() else { return };
    let a = RedisStore::connect(&g.url()).await.unwrap();
    granted(&a, &req("sentinel/alone", "a", Duration::from_secs(1)), Duration::from_secs(20)).await;
    let primary = g.primary_port().unwrap();
    g.nodes.iter_mut().find(|n| n.port() != primary).unwrap().kill();
    let t0 = Instant::now();
    let err = loop {
        match a.try_acquire(&req("sentinel/other", "a", Duration::from_secs(1))).await {
            Err(e) if e.to_string().contains("min_replicas") => break e,
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(r) => {
                assert!(t0.elapsed() < Duration::from_secs(5), "granted without a replica: {r:?}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(err.is_retryable(), "{err}");
    // min_replicas=0 takes the risk knowingly.
    let b = RedisStore::connect(&format!("{}?min_replicas=0", g.url())).await.unwrap();
    granted(&b, &req("sentinel/risky", "b", Duration::from_secs(1)), Duration::from_secs(20)).await;
}

/// The first attempt's error through `url`, written out whole with its causes.
async fn refusal(url: &str) -> String {
    let store = RedisStore::connect(url).await.unwrap();
    let got =
        tokio::time::timeout(Duration::from_secs(10), store.try_acquire(&req("tls/x", "z", Duration::from_secs(1))))
            .await;
    let Ok(Err(err)) = got else { panic!("granted through {url}, or no answer: {got:?}") };
    let mut chain = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(&err);
    while let Some(c) = cause {
        chain.push(c.to_string());
        cause = c.source();
    }
    chain.join(": ")
}

/// Client certificates behind sentinels (`cert=`, `key=`), and an error that names which
/// server refused: the sentinels, or the primary they named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_presents_a_client_certificate_and_names_the_server_that_refused() {
    // Every server and sentinel asks for a client certificate, and the primary's own
    // certificate is signed by a CA the servers trust but `ca.pem` does not name.
    let Some(certs) = tenure_testkit::certs::Certs::make() else { return };
    let how = SentinelTls { require_client_certs: true, primary_by_other_ca: true };
    let Some(g) = RedisSentinels::launch_tls_with(certs.dir(), how) else { return };
    let url = g.url();
    let with = |who: &str| {
        format!("{url}&cert={}&key={}", certs.path(&format!("{who}.pem")), certs.path(&format!("{who}.key")))
    };
    // No certificate: the sentinels refuse, and are named.
    let chain = refusal(&url).await;
    assert!(chain.contains("finding the primary through the sentinels"), "{chain}");
    // Our certificate: the sentinels answer, and the primary they name is refused by us.
    let chain = refusal(&with("client")).await;
    assert!(chain.contains("connecting to the primary 127.0.0.1:") && chain.contains("the sentinels named"), "{chain}");
    assert!(chain.contains("TLS certificate was not accepted"), "{chain}");
    assert!(!chain.contains("through the sentinels"), "{chain}");
    // Both CAs named, and our certificate: granted.
    let good = with("client").replace(&certs.path("ca.pem"), &certs.path("servers-ca.pem"));
    let store = RedisStore::connect(&good).await.unwrap();
    granted(&store, &req("tls/x", "a", Duration::from_secs(1)), Duration::from_secs(20)).await;
}

/// `rediss+sentinel://`: the sentinels and the primary they name are reached over TLS and
/// verified against `ca=` (another CA, or the system's roots, are refused), and the store
/// follows a failover to the other server, over TLS too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_verifies_the_sentinels_and_the_primary_and_follows_a_failover() {
    let Some(certs) = tenure_testkit::certs::Certs::make() else { return };
    let Some(g) = RedisSentinels::launch_tls(certs.dir()) else { return };
    let url = g.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    for (bad, why, says) in [
        (url.replace("ca.pem", "other-ca.pem"), "a CA that signed neither", "UnknownIssuer"),
        (url.split('?').next().unwrap().to_string(), "the system's roots only", "UnknownIssuer"),
        (url.replace("rediss+sentinel://", "redis+sentinel://").split('?').next().unwrap().to_string(), "no TLS", ""),
    ] {
        let chain = refusal(&bad).await;
        assert!(chain.contains(says), "{why}: {chain}");
        if !says.is_empty() {
            assert!(chain.contains("TLS certificate was not accepted"), "{why}: {chain}");
        }
    }
    let a = RedisStore::connect(&url).await.unwrap();
    assert!(a.describe().starts_with("rediss+sentinel://127.0.0.1:"), "{}", a.describe());
    let ttl = Duration::from_secs(1);
    granted(&a, &req("tls/x", "a", ttl), Duration::from_secs(20)).await;
    let before = g.primary_port().unwrap();
    let after = tokio::task::block_in_place(|| g.failover());
    assert_ne!(before, after);
    // Once the failover's guard is over, the promoted server grants, over TLS.
    granted(&a, &req("tls/y", "b", ttl), Duration::from_secs(20)).await;
}
