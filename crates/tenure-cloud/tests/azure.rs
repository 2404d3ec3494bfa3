//! The Azure Blob lease store against a throwaway Azurite (which checks SharedKey
//! signatures and keeps blobs across restarts, though not their leases): the conformance
//! suite with 15 s leases and a restart, the multi-candidate scenario, and clear errors
//! for bad URLs, TTLs and keys.

use std::sync::Arc;
use std::time::Duration;

use tenure::store::{AcquireRequest, ExpiryJudge};
use tenure::{ElectionName, ErrorKind, HolderId};
use tenure_cloud::{AzureConfig, AzureStore};
use tenure_testkit::conformance;
use tenure_testkit::scenario;
use tenure_testkit::servers::Kind;

mod common;
use common::Emulator;

fn azurite() -> Option<Emulator> {
    let open: common::Opener = |endpoint, container| {
        let config = AzureConfig::emulator(&endpoint, container).unwrap();
        Box::pin(async move { Arc::new(AzureStore::connect_with(config).await.unwrap()) as _ })
    };
    // Blob leases last 15 to 60 seconds.
    Some(Emulator::launch(Kind::Azurite, open)?.short_ttl(Duration::from_secs(15)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_store_conforms() {
    let Some(azurite) = azurite() else { return };
    assert_eq!(azurite.open("conformance").await.expiry(), ExpiryJudge::ByStore);
    conformance::run_all(azurite).await;
}

/// Azurite forgets leases when it restarts; the scenario's restart shows that the store
/// still makes no second leader (its observer guard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_candidates_survive_killed_connections_and_a_restart() {
    let Some(azurite) = azurite() else { return };
    let r = scenario::multi_candidate(&azurite, Duration::from_secs(15), Duration::from_secs(3)).await;
    eprintln!("azure scenario: {} terms, takeover {:?} after the leader was cut off", r.terms, r.takeover);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_ttls_and_keys_give_clear_errors() {
    for (url, says) in [
        ("azblob://", "account name"),
        ("azblob://acct", "container name"),
        ("azblob://acct/Bad_Container", "container name"),
        ("azblob://acct/leases/../x", "prefix"),
        ("azblob://acct/leases?x=1", "parameters"),
        ("s3://acct/leases", "not an Azure Blob URL"),
    ] {
        let err = AzureConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{url}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    let Some(azurite) = azurite() else { return };
    let store = azurite.open("errors").await;
    let req =
        AcquireRequest::new(ElectionName::new("a").unwrap(), HolderId::new("h").unwrap(), Duration::from_secs(10));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert!(err.to_string().contains("15 to 60 seconds"), "{err}");
    // A wrong key is refused by the service, and said so.
    let mut wrong = AzureConfig::emulator(&azurite.endpoint(), "errors").unwrap();
    wrong.key = vec![7; 64];
    let err = AzureStore::connect_with(wrong).await.err().expect("a wrong key is refused");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_server_errors_are_retried() {
    let Some(azurite) = azurite() else { return };
    let xml = |code: &str| {
        format!("<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code><Message>m</Message></Error>")
    };
    let replies = [
        (common::http_reply("503 The server is busy.", "application/xml", &xml("ServerBusy")), "HTTP 503"),
        (common::http_reply("500 Operation timed out.", "application/xml", &xml("OperationTimedOut")), "HTTP 500"),
        (common::http_reply("429 Too Many Requests", "application/xml", &xml("ServerBusy")), "HTTP 429"),
    ];
    azurite.refusals_are_retried("refusals", &replies).await;
}

/// Sixteen campaigners at once, on an emulator starved of CPU: one grant per vacancy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grant_per_vacancy_on_a_starved_server() {
    let Some(emulator) = azurite() else { return };
    emulator.one_grant_per_vacancy_on_a_starved_server("contended", 100).await;
}
