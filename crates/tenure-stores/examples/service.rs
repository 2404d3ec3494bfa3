//! README's library example, runnable: a service that does its work only while it leads,
//! on the store `TENURE_STORE` names (the host-local SQLite file without it), and hands
//! over at once when it is stopped (SIGTERM, Ctrl-C).
//!
//! ```sh
//! TENURE_STORE=sqlite:/tmp/service.db cargo run -p tenure-stores --example service   # in two terminals
//! ```

use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = tenure_stores::connect_env().await?;
    let elector = tenure::Elector::builder(store, "billing/nightly").ttl(Duration::from_secs(10)).build()?;
    elector.stop_on_signals()?; // SIGTERM or Ctrl-C: release the lease, the next replica leads at once
    let ran = elector
        .run_while_leader(|leadership| async move {
            println!("leading with token {}", leadership.token().0);
            while leadership.is_valid() {
                // The work, carrying leadership.token() to what it writes.
                tokio::select! {
                    _ = leadership.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            println!("stepped down");
        })
        .await;
    match ran {
        Ok(()) | Err(tenure::ElectError::ShutDown) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
