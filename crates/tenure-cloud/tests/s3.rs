//! The S3 store against a throwaway moto server: the conformance suite, the
//! multi-candidate scenario, a newcomer's wait, and clear errors for bad URLs and
//! unreachable services. moto keeps its objects in memory, so restarts are skipped.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest, ExpiryJudge};
use tenure::{ElectionName, ErrorKind, HolderId};
use tenure_cloud::{AwsCredentials, S3Config, S3Store};
use tenure_testkit::conformance;
use tenure_testkit::scenario;
use tenure_testkit::servers::Kind;

mod common;
use common::Emulator;

fn config(endpoint: String, bucket: &str) -> S3Config {
    S3Config {
        bucket: bucket.into(),
        prefix: "tenure".into(),
        region: "eu-west-1".into(),
        endpoint: Some(endpoint),
        credentials: AwsCredentials::new("test-key", "test-secret"),
    }
}

fn moto() -> Option<Emulator> {
    Emulator::launch(Kind::Moto, |endpoint, bucket| {
        Box::pin(async move { Arc::new(S3Store::connect_with(config(endpoint, bucket)).await.unwrap()) as _ })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_conforms() {
    let Some(moto) = moto() else { return };
    let store = moto.open("conformance").await;
    assert_eq!(store.expiry(), ExpiryJudge::ByObserver);
    assert!(store.watch(&ElectionName::new("a").unwrap()).is_none(), "S3 cannot notify; followers poll");
    conformance::run_all(moto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections() {
    let Some(moto) = moto() else { return };
    let r = scenario::multi_candidate(&moto, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("s3 scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

/// Another handle (another process) sees a record it has never seen before as live for a
/// whole TTL, however old the record is: it cannot know when it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_waits_a_whole_ttl_before_taking_over() {
    let Some(moto) = moto() else { return };
    let e = ElectionName::new("jobs/newcomer").unwrap();
    let ttl = Duration::from_millis(400);
    let a = moto.open("newcomer").await;
    let req = |h: &str| AcquireRequest::new(e.clone(), HolderId::new(h).unwrap(), ttl);
    assert!(matches!(a.try_acquire(&req("a")).await.unwrap(), Acquire::Acquired(_)));
    tokio::time::sleep(ttl * 2).await;
    // Long expired for the writer's handle, but a new handle must first watch it for a TTL.
    assert_eq!(a.get(&e).await.unwrap(), None);
    let b = moto.open("newcomer").await;
    let Acquire::Held(rec) = b.try_acquire(&req("b")).await.unwrap() else { panic!("a newcomer took over at once") };
    assert!(rec.remaining.unwrap() > ttl, "the newcomer counts the whole TTL plus margin from now");
    tokio::time::sleep(ttl + ttl / 10).await;
    assert!(matches!(b.try_acquire(&req("b")).await.unwrap(), Acquire::Acquired(l) if l.token.0 == 2));
}

#[tokio::test]
async fn bad_urls_and_unreachable_services_give_clear_errors() {
    for (url, says) in [
        ("s3://", "bucket name"),
        ("s3://Bad_Bucket/x", "bucket name"),
        ("s3://bucket/../x", "prefix"),
        ("s3://bucket/x?colour=red", "parameters"),
        ("gs://bucket", "not an S3 URL"),
    ] {
        let err = S3Config::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let port = tenure_testkit::servers::free_port();
    let err = S3Store::connect_with(config(format!("http://127.0.0.1:{port}"), "nowhere"))
        .await
        .err()
        .expect("nothing listens there");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_server_errors_are_retried() {
    let Some(moto) = moto() else { return };
    let xml = |code: &str| format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>");
    let replies = [
        (common::http_reply("503 Slow Down", "application/xml", &xml("SlowDown")), "HTTP 503"),
        (common::http_reply("500 Internal Server Error", "application/xml", &xml("InternalError")), "HTTP 500"),
        (common::http_reply("429 Too Many Requests", "application/xml", &xml("TooManyRequests")), "HTTP 429"),
        (common::http_reply("400 Bad Request", "application/xml", &xml("RequestTimeout")), "RequestTimeout"),
    ];
    moto.refusals_are_retried("refusals", &replies).await;
}

/// Sixteen campaigners at once, on an emulator starved of CPU: one grant per vacancy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grant_per_vacancy_on_a_starved_server() {
    let Some(emulator) = moto() else { return };
    emulator.one_grant_per_vacancy_on_a_starved_server("contended", 150).await;
}
