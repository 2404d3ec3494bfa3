//! The memory store passes the conformance suite (on paused time: expiry costs nothing).

use std::sync::Arc;

use tenure::{LeaseStore, MemoryStore};
use tenure_testkit::conformance::{self, Harness};

struct Memory(MemoryStore);

#[async_trait::async_trait]
impl Harness for Memory {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Arc::new(self.0.clone())
    }
}

#[tokio::test(start_paused = true)]
async fn memory_store_conforms() {
    conformance::run_all(Memory(MemoryStore::new())).await;
}
