//! The DynamoDB store against a throwaway moto server: the conformance suite, the
//! multi-candidate scenario, and clear errors for bad URLs. moto keeps its tables in
//! memory, so restarts are skipped.

use std::sync::Arc;
use std::time::Duration;

use tenure::ErrorKind;
use tenure::store::ExpiryJudge;
use tenure_cloud::{AwsCredentials, DynamoConfig, DynamoStore};
use tenure_testkit::conformance;
use tenure_testkit::scenario;
use tenure_testkit::servers::Kind;

mod common;
use common::Emulator;

fn moto() -> Option<Emulator> {
    Emulator::launch(Kind::Moto, |endpoint, table| {
        let config = DynamoConfig {
            table: table.into(),
            region: "eu-west-1".into(),
            endpoint: Some(endpoint),
            credentials: AwsCredentials::new("test-key", "test-secret"),
        };
        Box::pin(async move { Arc::new(DynamoStore::connect_with(config).await.unwrap()) as _ })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_store_conforms() {
    let Some(moto) = moto() else { return };
    assert_eq!(moto.open("conformance").await.expiry(), ExpiryJudge::ByObserver);
    conformance::run_all(moto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections() {
    let Some(moto) = moto() else { return };
    let r = scenario::multi_candidate(&moto, Duration::from_secs(2), Duration::from_millis(1000)).await;
    eprintln!("dynamodb scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[test]
fn bad_urls_give_clear_errors() {
    for (url, says) in [
        ("dynamodb://", "table name"),
        ("dynamodb://a", "table name"),
        ("dynamodb://bad name", "table name"),
        ("dynamodb://leases?x=1", "parameters"),
        ("s3://leases", "not a DynamoDB URL"),
    ] {
        let err = DynamoConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_server_errors_are_retried() {
    let Some(moto) = moto() else { return };
    let json = |t: &str| format!("{{\"__type\":\"com.amazonaws.dynamodb.v20120810#{t}\",\"message\":\"m\"}}");
    let amz = "application/x-amz-json-1.0";
    let replies = [
        (common::http_reply("400 Bad Request", amz, &json("ThrottlingException")), "ThrottlingException"),
        (
            common::http_reply("400 Bad Request", amz, &json("ProvisionedThroughputExceededException")),
            "ProvisionedThroughputExceededException",
        ),
        (common::http_reply("500 Internal Server Error", amz, &json("InternalServerError")), "HTTP 500"),
        (common::http_reply("503 Service Unavailable", amz, &json("ServiceUnavailable")), "HTTP 503"),
    ];
    moto.refusals_are_retried("refusals", &replies).await;
}

/// Sixteen campaigners at once, on an emulator starved of CPU: one grant per vacancy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grant_per_vacancy_on_a_starved_server() {
    let Some(emulator) = moto() else { return };
    emulator.one_grant_per_vacancy_on_a_starved_server("contended", 150).await;
}
