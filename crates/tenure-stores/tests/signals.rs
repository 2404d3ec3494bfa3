//! A service stopped by SIGTERM (every rolling deploy) hands over at once with
//! `Elector::stop_on_signals`, instead of leaving the next replica a whole TTL to wait.

use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_hands_over_at_once_with_stop_on_signals() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("t.db").display());
    let ttl = Duration::from_secs(10);
    let elector = |store| tenure::Elector::builder(store, "billing/nightly").ttl(ttl).build().unwrap();
    let a = elector(tenure_stores::connect(&url).await.unwrap());
    a.stop_on_signals().unwrap();
    let (led_tx, led_rx) = tokio::sync::oneshot::channel();
    let mut led_tx = Some(led_tx);
    let a_runs = {
        let a = a.clone();
        tokio::spawn(async move {
            a.run_while_leader(move |l| {
                if let Some(tx) = led_tx.take() {
                    let _ = tx.send(l.token());
                }
                async move { l.cancelled().await }
            })
            .await
        })
    };
    let a_token = led_rx.await.unwrap();
    let b = elector(tenure_stores::connect(&url).await.unwrap());
    let b_leads = {
        let b = b.clone();
        tokio::spawn(async move { b.leadership().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let signalled = Instant::now();
    let killed = std::process::Command::new("kill").args(["-TERM", &std::process::id().to_string()]).status().unwrap();
    assert!(killed.success());
    let lb = tokio::time::timeout(ttl, b_leads).await.expect("b was elected within a TTL").unwrap().unwrap();
    let took = signalled.elapsed();
    assert!(lb.token() > a_token);
    // A handover, not an expiry: far sooner than the TTL a crash would cost.
    assert!(took < ttl / 4, "b was elected {took:?} after a's SIGTERM (TTL {ttl:?})");
    assert!(matches!(a_runs.await.unwrap(), Err(tenure::ElectError::ShutDown)));
    drop(lb);
    b.shutdown().await;
}
