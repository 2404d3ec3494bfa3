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
//! The pieces, for application code:
//! - [`Elector`]: the runtime, configured by [`Config`]. [`Leadership`] is what the leader
//!   holds; [`Event`]s tell of elections and step-downs.
//! - [`Elector::run_once`]: a unit of work (this report, this cron slot) done once across
//!   every candidate and term, through the store's work [`ledger`].
//! - [`holders`]: N holders of one election at once ([`Config::holders`]), each with its
//!   own index and token.
//! - [`observe`]: who leads, for programs that only watch; [`candidates`]: who else
//!   campaigns, for candidates that announce themselves ([`Config::announce`]).
//! - [`LeaseStore`]: a store to elect on (SQLite, PostgreSQL, … in crates of their own);
//!   [`MemoryStore`] is the in-process one, [`Batched`] shares one store's round trips
//!   among many electors.
//! - [`Clock`]: all time is read through it, so tests run on paused time.
//! - [`faults`]: a store wrapper that fails on command, to test a service against an
//!   outage, a slow store or a lost answer.
//!
//! For those who write a store: [`store`] holds the contract's requests and answers, what
//! an implementation owes (on [`LeaseStore`]), and helpers for watches
//! ([`store::ChangeHub`]) and for stores without a clock ([`store::observed`]). The
//! `tenure-testkit` crate's conformance suite (`tenure_testkit::conformance::run_all`)
//! checks a store against every duty, on a real server.

mod batch;
mod clock;
mod config;
mod elector;
pub mod faults;
#[cfg(test)]
mod fuzz;
pub mod holders;
pub mod ledger;
mod memory;
pub mod metrics;
mod name;
mod observe;
mod once;
mod presence;
mod record;
pub mod store;

pub use batch::{Batched, DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT, DEFAULT_WINDOW};
pub use clock::{Clock, Instant, TokioClock, host_suspended};
pub use config::{Config, ConfigError, TermTimes};
pub use elector::{
    BuildError, EVENTS_BUFFERED, ElectError, Elector, ElectorBuilder, Event, Leadership, ProclaimError, StepDownReason,
    Watchdog,
};
pub use memory::MemoryStore;
pub use name::{
    ELECTION_NAME_RULE, ElectionName, HOLDER_ID_RULE, HolderId, INSTANCE_NAME_MAX, NameError, WORK_KEY_RULE, WorkKey,
    host_name,
};
pub use observe::{Observer, observe, observe_with};
pub use once::Once;
pub use presence::{Candidate, Health, RESERVED_PREFIX, candidates, reserve};
pub use record::{Evict, FencingToken, Leader, LeaseRecord};
pub use store::{ErrorKind, LeaseStore, StoreError};
pub use tokio_util::sync::CancellationToken;

/// Whether the planted bug `name` is switched on (`TENURE_MUTANT=NAME[,NAME…]`), for CI
/// to prove that the check guarding it catches it; the one switch of every tenure crate.
/// Only a build with this crate's `mutants` feature has planted bugs: the test builds of
/// tenure's own workspace, where the test kit turns it on for its tests. Anywhere else it
/// is `false`, and the code it guards is compiled out. Not part of the API.
#[doc(hidden)]
#[cfg(feature = "mutants")]
pub fn mutant(name: &str) -> bool {
    std::env::var("TENURE_MUTANT").is_ok_and(|m| m.split(',').any(|m| m == name))
}

/// Whether the planted bug `name` is switched on: never, in a build without the `mutants`
/// feature (see the other `mutant`). Not part of the API.
#[doc(hidden)]
#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub const fn mutant(_name: &str) -> bool {
    false
}
