//! The NATS store against a throwaway nats-server with JetStream: the conformance suite
//! (restarts included) on a bucket with one TTL, the multi-candidate scenario, the TTL
//! check against the bucket's max-age, and clear errors for bad passwords and
//! unreachable servers.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest};
use tenure::{ElectionName, ErrorKind, HolderId, LeaseStore};
use tenure_nats::NatsStore;
use tenure_testkit::conformance;
use tenure_testkit::harness::{Opener, Served};
use tenure_testkit::servers::{self, Kind};

/// The bucket's max-age in the conformance run: every lease there has this TTL.
const BUCKET_TTL: Duration = Duration::from_secs(3);

/// A throwaway nats-server behind a proxy; stores open the bucket `leases`, whose
/// max-age makes every lease there last [`BUCKET_TTL`].
fn nats() -> Option<Served> {
    let open: Opener =
        |url| Box::pin(async move { Arc::new(NatsStore::connect(&format!("{url}/leases")).await.unwrap()) as _ });
    Some(Served::behind_proxy(Kind::Nats, open)?.short_ttl(BUCKET_TTL).long_ttl(BUCKET_TTL))
}

/// The URL of `bucket` on the server of `h`, through its proxy.
fn bucket_url(h: &Served, bucket: &str) -> String {
    format!("{}/{bucket}", h.url())
}

tenure_testkit::store_suite! {
    conforms: nats_store_conforms => nats(),
    scenario: five_candidates_survive_killed_connections_and_a_restart => nats(),
    ttl: Duration::from_secs(2),
    slack: Duration::from_millis(500),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_other_than_the_buckets_is_refused_and_writes_nothing() {
    let Some(nats) = nats() else { return };
    let store = NatsStore::connect(&bucket_url(&nats, "ttl")).await.unwrap();
    let e = ElectionName::new("ttl/check").unwrap();
    let a = HolderId::new("a").unwrap();
    // The first acquire creates the bucket with its TTL.
    let l = match store.try_acquire(&AcquireRequest::new(e.clone(), a.clone(), Duration::from_secs(5))).await.unwrap() {
        Acquire::Acquired(l) => l,
        Acquire::Held(r) => panic!("held by {}", r.holder),
    };
    let other = NatsStore::connect(&bucket_url(&nats, "ttl")).await.unwrap();
    let b = HolderId::new("b").unwrap();
    let err = other.try_acquire(&AcquireRequest::new(e.clone(), b, Duration::from_secs(7))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("5s") && msg.contains("7s") && msg.contains("--ttl 5s"), "{msg}");
    assert!(other.renew(&l, Duration::from_secs(7)).await.is_err());
    let cur = other.get(&e).await.unwrap().expect("the lease is untouched");
    assert_eq!((cur.holder, cur.token, cur.revision), (a, l.token, l.revision));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_before_the_bucket_exists_find_nothing_and_create_nothing() {
    let Some(nats) = nats() else { return };
    let store = NatsStore::connect(&bucket_url(&nats, "later")).await.unwrap();
    let e = ElectionName::new("x").unwrap();
    assert_eq!(store.get(&e).await.unwrap(), None);
    assert!(store.list("").await.unwrap().is_empty());
    assert_eq!(store.evict(&e, tenure::Evict::Now).await.unwrap(), None);
    let client = async_nats::connect(format!("127.0.0.1:{}", nats.proxy().unwrap().port())).await.unwrap();
    let js = async_nats::jetstream::new(client);
    assert!(js.get_stream("KV_later").await.is_err(), "a read created the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_clear_error() {
    let Some(server) = servers::launch_with(Kind::Nats, Some("right-password")) else { return };
    let bad = format!("nats://tenure:wrong-password@127.0.0.1:{}/b", server.port());
    let wrong = NatsStore::connect(&bad).await.unwrap();
    let right = NatsStore::connect(&format!("{}/b", server.url())).await.unwrap();
    conformance::a_wrong_password_is_refused(&wrong, "wrong-password", "check the user and password", &right).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error() {
    let port = servers::free_port();
    let store = NatsStore::connect(&format!("nats://127.0.0.1:{port}/b")).await.unwrap();
    conformance::an_unreachable_server_is_retryable(&store, Some("NATS")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_jetstream_is_retried_and_served_again_once_it_is_back() {
    // The server comes back from a restart without JetStream (a configuration mistake
    // being fixed, JetStream disabled for lack of resources): requests find no
    // responders. That clears once JetStream is back, so it must never be fatal.
    let Some(mut server) = servers::launch(Kind::Nats) else { return };
    let url = format!("nats://127.0.0.1:{}/nojs", server.port());
    let store = NatsStore::connect(&url).await.unwrap();
    let ttl = Duration::from_secs(2);
    let req = |name: &str| AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), ttl);
    let Acquire::Acquired(_) = store.try_acquire(&req("before")).await.unwrap() else { panic!() };
    server.kill();
    let program = servers::find_program("nats-server").unwrap();
    let mut plain = std::process::Command::new(program)
        .args(["-a", "127.0.0.1", "-p", &server.port().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let err = loop {
        match store.try_acquire(&req("during")).await {
            Err(e) if e.to_string().contains("JetStream") => break e,
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(a) => panic!("a write went through without JetStream: {a:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the client never reached the server without JetStream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(err.is_retryable(), "JetStream being away must be retried, not end the campaign: {err}");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    plain.kill().unwrap();
    plain.wait().unwrap();
    server.start();
    let t0 = std::time::Instant::now();
    loop {
        match store.try_acquire(&req("during")).await {
            Ok(Acquire::Acquired(_)) => break,
            Ok(other) => panic!("nobody else campaigns, yet: {other:?}"),
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(t0.elapsed() < Duration::from_secs(20), "still refused 20 s after JetStream came back: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
