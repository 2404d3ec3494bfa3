//! A replica that does its job only while it leads, on the embedded SQLite store.
//!
//! Run it in three terminals (same database file), then stop or kill the leader:
//!
//! ```text
//! cargo run -p tenure-sqlite --example worker -- /tmp/worker.db
//! ```

use std::sync::Arc;
use std::time::Duration;

use tenure::Elector;
use tenure_sqlite::SqliteStore;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| "/tmp/tenure-worker.db".into());
    let store = Arc::new(SqliteStore::open(&path).await?);
    let elector = Elector::builder(store, "example/worker").ttl(Duration::from_secs(3)).build()?;
    println!("{} campaigning on {path}", elector.holder());

    let stopper = elector.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stopper.shutdown().await; // releases the lease: the next replica leads at once
    });

    let result = elector
        .run_while_leader(|leadership| async move {
            println!("leading with fencing token {}", leadership.token());
            while leadership.is_valid() {
                println!("  working (token {}, {:?} left)", leadership.token(), leadership.remaining());
                tokio::select! {
                    _ = leadership.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
            println!("stopped leading");
        })
        .await;
    if result.is_err() {
        println!("shut down");
    }
    Ok(())
}
