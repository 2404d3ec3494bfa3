//! Two candidates in one process on the in-memory store: one leads, resigns, and
//! the other takes over at once with a larger fencing token.
//!
//! ```text
//! cargo run -p tenure --example two_candidates
//! ```

use std::sync::Arc;
use std::time::Duration;

use tenure::{Elector, Event, MemoryStore};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::new());
    let a = Elector::builder(store.clone(), "example/report").holder("alice").ttl(Duration::from_secs(2)).build()?;
    let b = Elector::builder(store.clone(), "example/report").holder("bob").ttl(Duration::from_secs(2)).build()?;
    let mut events = b.events();
    tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            if let Event::LeaderChanged(leader) = ev {
                match leader {
                    Some(l) => println!("bob sees leader: {l}"),
                    None => println!("bob sees: no leader"),
                }
            }
        }
    });

    let lead = a.leadership().await?;
    b.start();
    println!("alice leads with token {}", lead.token());
    tokio::time::sleep(Duration::from_millis(300)).await;
    lead.resign().await;
    let lead = b.leadership().await?;
    println!("bob leads with token {}", lead.token());
    drop(lead);
    b.shutdown().await;
    a.shutdown().await;
    Ok(())
}
