//! The election runtime: campaign, lead, renew, step down, hand over.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::{broadcast, oneshot};
use tokio_stream::StreamExt;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::clock::{Clock, Instant, TokioClock};
use crate::config::{Config, ConfigError, TermTimes};
use crate::name::{ElectionName, HolderId, NameError};
use crate::presence::{Standing, Successor};
use crate::record::{Acquire, AcquireRequest, Leader, LeaseRecord, Renew};
use crate::store::{ErrorKind, LeaseStore, StoreError, WatchStream};

/// How many events an [`Elector`] keeps for a subscriber that has not read them yet.
pub const EVENTS_BUFFERED: usize = 256;

/// Logs a term's news at INFO, or at DEBUG for tenure's own presence leases (whose lines
/// would otherwise double every announcing candidate's).
macro_rules! note {
    ($shared:expr, $($arg:tt)*) => {
        if $shared.req.election.as_str().starts_with(crate::RESERVED_PREFIX) {
            tracing::debug!($($arg)*)
        } else {
            tracing::info!($($arg)*)
        }
    };
}

// The runtime, one concern a file. The root holds the candidate ([`Elector`]), its shared
// state and the campaign loop that alternates following and leading; a handover reads
// `lead.rs` (a term, and its end in `Leading::step_down`), then `follow.rs` (the next
// candidate's attempts), in that order.
mod api;
mod builder;
mod checks;
mod failures;
mod follow;
mod lead;
mod leadership;
mod release;
mod slots;
mod sync;
mod view;

pub use api::{BuildError, ElectError, Event, ProclaimError, StepDownReason};
pub use builder::ElectorBuilder;
pub use leadership::{Leadership, Watchdog};

use checks::{other_kind, reserve, successor};
use failures::{Failures, error_chain};
use follow::{follow, next_event, stop_following};
use lead::lead;
use leadership::{Ask, Asks, Proclaim, Resign, Term};
use release::{RELEASE_TIMEOUTS, give_back, release};
use slots::follow_slots;
use sync::{Flag, Published, Stopped, once_seen};
use view::View;

/// A candidate in one election.
///
/// It campaigns in a background task once started, leads while it holds the lease,
/// renews it, steps down before its local deadline when it cannot, and campaigns
/// again after it loses. Clones share the same candidate; when the last clone is
/// dropped, the candidate shuts down as [`Elector::shutdown`] would.
#[derive(Clone)]
pub struct Elector {
    shared: Arc<Shared>,
    _guard: Arc<DropGuard>,
}

struct Shared {
    store: Arc<dyn LeaseStore>,
    req: AcquireRequest,
    /// With several holders ([`Config::holders`]), the request for each slot, by index.
    slots: Vec<AcquireRequest>,
    cfg: Config,
    clock: Arc<dyn Clock>,
    /// Made by the first subscriber: with thousands of electors in a process, those that
    /// nobody listens to do not carry a buffer of events.
    events: OnceLock<broadcast::Sender<Event>>,
    /// The leadership handed out, while this candidate leads.
    leadership: Published,
    shutdown: CancellationToken,
    /// Set when the campaign task has ended.
    stopped: Flag,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Why the campaign stopped, if not by shutdown.
    failure: Mutex<Option<ElectError>>,
    metrics: crate::metrics::ElectorMetrics,
    /// The presence lease's candidate, with [`Config::announce`].
    presence: Option<Elector>,
    /// Whether a single holder has looked for holders of slots (in its first term).
    kinds_checked: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Tells the subscribers, if there are any.
    fn send_event(&self, ev: Event) {
        if let Some(tx) = self.events.get() {
            let _ = tx.send(ev);
        }
    }
}

impl Elector {
    /// Starts building a candidate for `election` on `store`.
    pub fn builder(store: Arc<dyn LeaseStore>, election: impl AsRef<str>) -> ElectorBuilder {
        ElectorBuilder {
            store,
            election: ElectionName::new(election),
            holder: None,
            ttl: Duration::from_secs(10),
            edits: Vec::new(),
            clock: Arc::new(TokioClock),
        }
    }

    /// The election.
    pub fn election(&self) -> &ElectionName {
        &self.shared.req.election
    }

    /// This candidate's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.shared.req.holder
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The store this candidate campaigns on.
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.shared.store
    }

    /// Events from now on. Subscribe before [`Elector::start`] to see every event. A
    /// subscriber that falls more than [`EVENTS_BUFFERED`] events behind misses the oldest
    /// (its next `recv` says how many).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.shared.events.get_or_init(|| broadcast::channel(EVENTS_BUFFERED).0).subscribe()
    }

    /// The live candidates of this election that announce themselves
    /// ([`Config::announce`]), by holder id.
    pub async fn candidates(&self) -> Result<Vec<crate::Candidate>, StoreError> {
        crate::presence::candidates(&*self.shared.store, self.election()).await
    }

    /// Starts campaigning in a background task (on the current tokio runtime). Idempotent.
    pub fn start(&self) {
        if let Some(p) = &self.shared.presence {
            p.start();
        }
        let mut task = self.shared.task.lock().unwrap_or_else(|p| p.into_inner());
        if task.is_none() && !self.shared.shutdown.is_cancelled() {
            let shared = self.shared.clone();
            *task = Some(tokio::spawn(async move {
                // Runs even if a store implementation panics: waiters must not hang,
                // and a published leadership must end.
                let stopped = Stopped(&shared);
                campaign_loop(&shared).await;
                std::mem::forget(stopped);
                Stopped::finish(&shared, false);
            }));
        }
    }

    /// Why the campaign stopped on its own, if it did.
    fn failure(&self) -> Option<ElectError> {
        let f = self.shared.failure.lock().unwrap_or_else(|p| p.into_inner());
        match &*f {
            Some(ElectError::Store(e)) => Some(ElectError::Store(e.clone())),
            Some(ElectError::Crashed) => Some(ElectError::Crashed),
            Some(ElectError::Unsupported(why)) => Some(ElectError::Unsupported(why.clone())),
            _ => None,
        }
    }

    /// Whether the campaign works: it has not stopped on its own (a store refusal no
    /// retry can mend, a crash), and it does not hold a term past its local deadline
    /// without having stepped down (a runtime that is stuck). What a liveness probe asks.
    pub fn is_healthy(&self) -> bool {
        if self.failure().is_some() {
            return false;
        }
        match &self.shared.leadership.get() {
            Some(l) => l.cancel.is_cancelled() || l.is_valid(),
            None => true,
        }
    }

    /// The current leadership, if this candidate leads right now: never one whose local
    /// deadline has passed, even before the runtime has got round to stepping down
    /// (after the process was frozen, say), so no work starts on a term that is over.
    pub fn current(&self) -> Option<Leadership> {
        self.shared.leadership.get().filter(Leadership::is_valid)
    }

    /// Starts campaigning if needed and waits until this candidate leads.
    pub async fn leadership(&self) -> Result<Leadership, ElectError> {
        self.start();
        loop {
            let changed = self.shared.leadership.changed.notified();
            tokio::pin!(changed);
            // Registered before looking, so a change after the look wakes it.
            changed.as_mut().enable();
            let published = self.shared.leadership.get().filter(|l| !l.cancel.is_cancelled());
            if let Some(l) = published.as_ref().filter(|l| l.is_valid()) {
                return Ok(l.clone());
            }
            if let Some(failure) = self.failure() {
                return Err(failure);
            }
            if self.shared.shutdown.is_cancelled() {
                return Err(ElectError::ShutDown);
            }
            // A term whose deadline passed before the runtime stepped down (the process
            // was frozen) is never handed out: wait until the runtime ends it, or a
            // renewal moves its deadline (which publishes nothing: look again shortly).
            let stale = async {
                match &published {
                    Some(l) => {
                        tokio::select! {
                            _ = l.cancelled() => {}
                            _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                        }
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = changed => {}
                _ = stale => {}
                _ = self.shared.shutdown.cancelled() => return Err(ElectError::ShutDown),
            }
        }
    }

    /// Runs `task` whenever this candidate leads: starts it on election, cancels it
    /// (through [`Leadership::cancelled`]) on loss, waits for it to finish, and starts
    /// it again on the next election.
    ///
    /// The lease is released only after the task has finished. When the task
    /// finishes on its own while still leading (its term still valid), the elector
    /// releases the lease, shuts down, and this returns the task's output; a task that
    /// returns after its term ended (a `while leadership.is_valid()` loop) is taken to
    /// have stopped for the loss, and is started again on the next election. If the
    /// elector is shut down first, it returns [`ElectError::ShutDown`] once the lease
    /// has been released.
    pub async fn run_while_leader<F, Fut, T>(&self, mut task: F) -> Result<T, ElectError>
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let leadership = match self.leadership().await {
                Ok(l) => l,
                Err(e) => {
                    // Shut down: return only once the lease has been released.
                    self.shutdown().await;
                    return Err(e);
                }
            };
            let cancel = leadership.cancel.clone();
            let mut fut = Box::pin(task(leadership.clone()));
            tokio::select! {
                biased;
                out = &mut fut => {
                    drop(fut);
                    // A task that returns once its term is over (a `while is_valid()`
                    // loop whose check came before the runtime's step-down) ended because
                    // leadership ended, not because its work is done: campaign on.
                    let done = !cancel.is_cancelled() && leadership.is_valid();
                    drop(leadership);
                    if done {
                        self.shutdown().await;
                        return Ok(out);
                    }
                }
                _ = cancel.cancelled() => {
                    // Lost: let the task wind down before the lease can be released.
                    fut.await;
                }
            }
        }
    }

    /// Shuts this candidate down ([`Elector::shutdown`]) when the process is asked to stop
    /// (SIGTERM, as a deploy or `systemctl stop` sends, or SIGINT, Ctrl-C): the current
    /// term's task is cancelled, the lease released once it has finished, and the next
    /// replica elected at once instead of a TTL later. [`Elector::run_while_leader`] then
    /// returns [`ElectError::ShutDown`]. The signal handlers are installed before this
    /// returns (it fails only if they cannot be); the wait runs in a task of its own, on
    /// the tokio runtime this is called from.
    pub fn stop_on_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let elector = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = elector.shared.shutdown.cancelled() => return,
            }
            tracing::info!(election = %elector.election(), "asked to stop: handing over");
            elector.shutdown().await;
        });
        Ok(())
    }

    /// Stops campaigning: cancels the current leadership, waits for every
    /// [`Leadership`] clone to be dropped, releases the lease, and returns.
    pub async fn shutdown(&self) {
        // The presence goes first (the lead loop waits for it before releasing), so that
        // the next winner does not find this candidate still announced and hand over to it.
        if let Some(p) = &self.shared.presence {
            p.shared.shutdown.cancel();
        }
        self.shared.shutdown.cancel();
        self.stopped().await;
        if let Some(p) = &self.shared.presence {
            p.stopped().await;
        }
    }

    /// Stops many candidates at once, as [`Elector::shutdown`] stops one: all are told to
    /// stop first, so their releases run together (and, through [`crate::Batched`], meet
    /// in few store calls), then each is waited for. Needs no task per candidate.
    pub async fn shutdown_all(electors: impl IntoIterator<Item = Elector>) {
        let electors: Vec<Elector> = electors.into_iter().collect();
        for e in &electors {
            if let Some(p) = &e.shared.presence {
                p.shared.shutdown.cancel();
            }
            e.shared.shutdown.cancel();
        }
        for e in &electors {
            e.stopped().await;
            if let Some(p) = &e.shared.presence {
                p.stopped().await;
            }
        }
    }

    /// Waits until the campaign task, if it was started, has ended.
    async fn stopped(&self) {
        let started = self.shared.task.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        if started {
            self.shared.stopped.wait().await;
        }
    }
}

async fn campaign_loop(shared: &Shared) {
    let cfg = &shared.cfg;
    if !cfg.splay.is_zero() {
        let splay = cfg.splay.mul_f64(fastrand::f64());
        if sleep_or_shutdown(shared, shared.clock.now() + splay).await {
            return;
        }
    }
    let mut view = View { shared, leader: None, lease_ends: None, vacant_since: None, takeover: None, seen: None };
    // Unhealthy resignations in a row (a resignation that asked to stand aside).
    let mut unhealthy = 0u32;
    // After a handover: the election is reserved for the successor until then.
    let mut defer = None;
    loop {
        let (index, mut lease, sent) = if shared.slots.is_empty() {
            let Some((lease, sent)) = follow(shared, &mut view, defer.take()).await else {
                return;
            };
            (None, lease, sent)
        } else {
            let Some((index, lease, sent)) = follow_slots(shared).await else {
                return;
            };
            (Some(index), lease, sent)
        };
        let (reason, stand_aside) = lead(shared, &mut view, index, &mut lease, sent, &mut unhealthy).await;
        match reason {
            StepDownReason::ShuttingDown => return,
            // Stand aside so that another candidate takes over.
            StepDownReason::Resigned | StepDownReason::Evicted
                if sleep_or_shutdown(
                    shared,
                    shared.clock.now() + cfg.resign_backoff.max(stand_aside).min(LONGEST_STAND_ASIDE),
                )
                .await =>
            {
                return;
            }
            StepDownReason::HandedOver { .. } => defer = Some(shared.clock.now() + stand_aside),
            _ => {}
        }
        if shared.shutdown.is_cancelled() {
            return;
        }
    }
}

/// The longest a candidate stands aside, whatever it was asked: a year.
const LONGEST_STAND_ASIDE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Sleeps until `until`; true if shutdown came first.
async fn sleep_or_shutdown(shared: &Shared, until: Instant) -> bool {
    tokio::select! {
        biased;
        _ = shared.clock.sleep_until(until) => false,
        _ = shared.shutdown.cancelled() => true,
    }
}

/// Runs a store call with a time limit; no answer by then is ambiguous.
async fn call<T>(
    shared: &Shared,
    what: &str,
    until: Instant,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = shared.clock.now();
    let limit = until.saturating_duration_since(started);
    let r = tokio::select! {
        biased;
        r = fut => r,
        _ = shared.clock.sleep_until(until) => Err(StoreError::timed_out(what, limit)),
    };
    let took = shared.clock.now().saturating_duration_since(started);
    shared.metrics.store_call(what, took, r.as_ref().err().map(StoreError::kind));
    r
}

#[cfg(test)]
mod tests;
