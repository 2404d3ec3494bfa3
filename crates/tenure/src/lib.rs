//! # tenure: leader election for programs that run as several replicas
//!
//! One replica, and only one, does a piece of work at a time. It leads while it
//! holds a lease on a shared store, renews it, steps down *before* its local
//! deadline when it cannot renew, and proves its leadership to the resources it
//! writes to with a [`FencingToken`] that grows with every new grant.
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use tenure::{Elector, MemoryStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(MemoryStore::new()); // or tenure_sqlite::SqliteStore, …
//! let elector = Elector::builder(store, "billing/nightly").ttl(Duration::from_secs(10)).build()?;
//! elector
//!     .run_while_leader(|leadership| async move {
//!         while leadership.is_valid() {
//!             println!("leading with token {}", leadership.token());
//!             tokio::select! {
//!                 _ = leadership.cancelled() => break,
//!                 _ = tokio::time::sleep(Duration::from_secs(1)) => {}
//!             }
//!         }
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! The pieces:
//! - [`LeaseStore`]: the store contract (what an implementation owes is in its docs);
//!   [`MemoryStore`] is the in-process implementation.
//! - [`Elector`]: the runtime. [`Leadership`] is what the leader holds.
//! - [`observe`]: who leads, for programs that only watch.
//! - [`Clock`]: all time is read through it, so tests run on paused time.

mod batch;
mod clock;
mod config;
mod elector;
mod memory;
mod metrics;
mod name;
mod observe;
pub mod observed;
mod record;
mod store;
pub mod url;
mod watch;

pub use batch::{Batched, DEFAULT_MAX_BATCH, DEFAULT_WINDOW};
pub use clock::{Clock, Instant, TokioClock, host_suspended};
pub use config::{Config, ConfigError, TermTimes};
pub use elector::{BuildError, ElectError, Elector, ElectorBuilder, Event, Leadership, OustReason, Watchdog};
pub use memory::MemoryStore;
pub use name::{ELECTION_NAME_RULE, ElectionName, HOLDER_ID_RULE, HolderId, NameError, host_name};
pub use observe::{Observer, observe, observe_with};
pub use observed::{Judgement, ObservedExpiry};
pub use record::{
    Acquire, AcquireRequest, Evict, ExpiryJudge, FencingToken, Leader, LeaseRecord, MAX_METADATA, MAX_TTL, MIN_TTL,
    Renew, Revision, check_ttl,
};
pub use store::{BoxError, ErrorKind, LeaseStore, StoreError, WatchEvent, WatchStream};
pub use tokio_util::sync::CancellationToken;
pub use watch::{Change, ChangeHub, rereading_watch, watch_changes};
