//! The GCS store against a throwaway fake-gcs-server (filesystem backend, so restarts
//! keep the objects): the conformance suite with a restart, the multi-candidate
//! scenario, and clear errors for bad URLs and missing buckets.

use std::sync::Arc;
use std::time::Duration;

use tenure::ErrorKind;
use tenure::store::ExpiryJudge;
use tenure_cloud::{GcsAuth, GcsConfig, GcsStore};
use tenure_testkit::conformance;
use tenure_testkit::scenario;
use tenure_testkit::servers::Kind;

mod common;
use common::Emulator;

fn config(endpoint: String, bucket: &str, project: Option<&str>) -> GcsConfig {
    GcsConfig {
        bucket: bucket.into(),
        prefix: "tenure".into(),
        endpoint,
        project: project.map(str::to_string),
        auth: GcsAuth::None,
    }
}

fn fake_gcs() -> Option<Emulator> {
    Emulator::launch(Kind::FakeGcs, |endpoint, bucket| {
        let config = config(endpoint, bucket, Some("test-project"));
        Box::pin(async move { Arc::new(GcsStore::connect_with(config).await.unwrap()) as _ })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_store_conforms() {
    let Some(gcs) = fake_gcs() else { return };
    assert_eq!(gcs.open("conformance").await.expiry(), ExpiryJudge::ByObserver);
    conformance::run_all(gcs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(gcs) = fake_gcs() else { return };
    let r = scenario::multi_candidate(&gcs, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("gcs scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_missing_buckets_give_clear_errors() {
    for (url, says) in [
        ("gs://", "bucket name"),
        ("gs://UPPER", "bucket name"),
        ("gs://bucket/a//../b", "prefix"),
        ("gs://bucket?x=1", "parameters"),
        ("s3://bucket", "not a GCS URL"),
    ] {
        let err = GcsConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let Some(gcs) = fake_gcs() else { return };
    let err = GcsStore::connect_with(config(gcs.endpoint(), "no-such-bucket", None))
        .await
        .err()
        .expect("no bucket, no project");
    assert_eq!(err.kind(), ErrorKind::Misconfigured);
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_server_errors_are_retried() {
    let Some(gcs) = fake_gcs() else { return };
    let json = |code: u16, reason: &str| {
        format!("{{\"error\":{{\"code\":{code},\"message\":\"m\",\"errors\":[{{\"reason\":\"{reason}\"}}]}}}}")
    };
    let replies = [
        (common::http_reply("429 Too Many Requests", "application/json", &json(429, "rateLimitExceeded")), "HTTP 429"),
        (common::http_reply("503 Service Unavailable", "application/json", &json(503, "backendError")), "HTTP 503"),
        (common::http_reply("500 Internal Server Error", "application/json", &json(500, "backendError")), "HTTP 500"),
        (
            common::http_reply("403 Forbidden", "application/json", &json(403, "userRateLimitExceeded")),
            "userRateLimitExceeded",
        ),
    ];
    gcs.refusals_are_retried("refusals", &replies).await;
}

/// Sixteen campaigners at once, on an emulator starved of CPU: one grant per vacancy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grant_per_vacancy_on_a_starved_server() {
    let Some(emulator) = fake_gcs() else { return };
    emulator.one_grant_per_vacancy_on_a_starved_server("contended", 100).await;
}
