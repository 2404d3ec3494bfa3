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

/// Why a leader stepped down.
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepDownReason {
    /// Renewal kept failing until the step-down time.
    RenewFailed,
    /// The store says the lease now belongs to someone else (or to nobody).
    Lost {
        /// The new holder, if the store named one.
        to: Option<Leader>,
    },
    /// An operator evicted this holder.
    Evicted,
    /// [`Leadership::resign`] was called.
    Resigned,
    /// The elector is shutting down.
    ShuttingDown,
    /// The process woke up (after a pause) past its local deadline.
    DeadlinePassed,
    /// Another announcing candidate should lead: one of higher priority, or the one a
    /// reservation names (`tenure evict --to`). The work stopped, then the lease was
    /// released for it (see [`Config::priority`]).
    HandedOver {
        /// The successor.
        to: HolderId,
    },
}

impl StepDownReason {
    /// A short name for the reason (`renew_failed`, `lost`, `evicted`, `resigned`,
    /// `shutting_down`, `deadline_passed`, `handed_over`), as metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            StepDownReason::RenewFailed => "renew_failed",
            StepDownReason::Lost { .. } => "lost",
            StepDownReason::Evicted => "evicted",
            StepDownReason::Resigned => "resigned",
            StepDownReason::ShuttingDown => "shutting_down",
            StepDownReason::DeadlinePassed => "deadline_passed",
            StepDownReason::HandedOver { .. } => "handed_over",
        }
    }
}

/// What an [`Elector`] tells its subscribers.
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// This candidate leads, with this token.
    Elected {
        /// The fencing token of the new term.
        token: crate::FencingToken,
    },
    /// This candidate stopped leading.
    SteppedDown {
        /// Why.
        reason: StepDownReason,
    },
    /// The leader as this candidate sees it changed; `None` means nobody leads.
    LeaderChanged(Option<Leader>),
}

/// Errors from building an [`Elector`].
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The election name or holder id was refused.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A setting was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Errors from waiting on an [`Elector`].
///
/// New variants may come in a minor release: a `match` needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectError {
    /// The elector was shut down (or dropped) before the wait ended.
    #[error("the elector has been shut down")]
    ShutDown,
    /// The store refused in a way no retry can mend (credentials, permissions, a bad
    /// configuration), so the elector stopped campaigning.
    #[error("the elector stopped: the store refused to work with it")]
    Store(#[source] Arc<StoreError>),
    /// The campaign task ended unexpectedly (a store implementation panicked).
    #[error("the elector's campaign task ended unexpectedly")]
    Crashed,
    /// The call does not go with this elector's settings (e.g. [`Elector::run_once`] with
    /// several holders); nothing was done.
    #[error("{0}")]
    Unsupported(String),
}

/// Errors from [`Leadership::set_metadata`].
#[derive(Debug, thiserror::Error)]
pub enum ProclaimError {
    /// The metadata is larger than [`MAX_METADATA`](crate::store::MAX_METADATA) bytes.
    #[error("metadata of {0} bytes is larger than the {max} bytes a lease holds", max = crate::store::MAX_METADATA)]
    TooLarge(usize),
    /// The term ended before the new metadata was published.
    #[error("the term has ended")]
    TermEnded,
    /// The store failed; the term goes on. After an [`ErrorKind::Ambiguous`] failure the
    /// new metadata may or may not have been published.
    #[error("the store could not publish the metadata")]
    Store(#[source] StoreError),
}

type ConfigEdit = Box<dyn FnOnce(&mut Config) + Send>;

/// Builds an [`Elector`]; see [`Elector::builder`].
pub struct ElectorBuilder {
    store: Arc<dyn LeaseStore>,
    election: Result<ElectionName, NameError>,
    holder: Option<Result<HolderId, NameError>>,
    ttl: Duration,
    edits: Vec<ConfigEdit>,
    clock: Arc<dyn Clock>,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $t:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $t) -> Self {
            self.edits.push(Box::new(move |c: &mut Config| c.$name = value));
            self
        }
    };
}

impl ElectorBuilder {
    /// The lease TTL; every other interval defaults to a fraction of it (see [`Config::new`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// This candidate's id (default [`HolderId::generate`]). An id names one candidate at
    /// a time: shut a candidate down before building another with the same id, since a
    /// store takes a record of the same holder for the same candidate's (its own live
    /// lease is a renewal to it, and a stopping candidate releases it). For a name that
    /// other processes may also be given, pass [`HolderId::instance_of`]`(name)`.
    pub fn holder(mut self, holder: impl AsRef<str>) -> Self {
        self.holder = Some(HolderId::new(holder));
        self
    }

    /// The clock (default tokio's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces every setting at once (the TTL included).
    pub fn config(mut self, config: Config) -> Self {
        self.ttl = config.ttl;
        self.edits.push(Box::new(move |c: &mut Config| *c = config));
        self
    }

    setter!(/// See [`Config::renew_interval`].
        renew_interval: Duration);
    setter!(/// See [`Config::renew_deadline`].
        renew_deadline: Duration);
    setter!(/// See [`Config::retry_period`].
        retry_period: Duration);
    setter!(/// See [`Config::request_timeout`].
        request_timeout: Duration);
    setter!(/// See [`Config::max_drift`].
        max_drift: f64);
    setter!(/// See [`Config::safety_margin`].
        safety_margin: Duration);
    setter!(/// See [`Config::cool_down`].
        cool_down: Duration);
    setter!(/// See [`Config::jitter`].
        jitter: f64);
    setter!(/// See [`Config::splay`].
        splay: Duration);
    setter!(/// See [`Config::resign_backoff`].
        resign_backoff: Duration);
    setter!(/// See [`Config::metadata`].
        metadata: Vec<u8>);
    setter!(/// See [`Config::announce`].
        announce: bool);
    setter!(/// See [`Config::priority`].
        priority: i32);
    setter!(/// See [`Config::holders`].
        holders: u32);

    /// Validates the settings and builds the elector. It does not campaign until
    /// [`Elector::start`] (or a method that waits for leadership) is called.
    pub fn build(self) -> Result<Elector, BuildError> {
        let election = self.election?;
        let holder = self.holder.unwrap_or_else(|| Ok(HolderId::generate()))?;
        let mut cfg = Config::new(self.ttl);
        for edit in self.edits {
            edit(&mut cfg);
        }
        cfg.validate()?;
        let slots = slot_requests(&election, &holder, &cfg)?;
        // The presence lease: a candidate of its own, in an election nobody else enters.
        let presence = match cfg.announce {
            true => Some(
                Elector::builder(self.store.clone(), crate::presence::name(&election, &holder).as_str())
                    .holder(holder.as_str())
                    .ttl(cfg.ttl)
                    .clock(self.clock.clone())
                    .metadata(crate::presence::encode(cfg.priority, None, &cfg.metadata))
                    .build()?,
            ),
            false => None,
        };
        let shutdown = CancellationToken::new();
        let metrics = crate::metrics::ElectorMetrics::new(election.as_str());
        let shared = Arc::new(Shared {
            metrics,
            store: self.store,
            req: AcquireRequest { election, holder, ttl: cfg.ttl, metadata: cfg.metadata.clone() },
            slots,
            cfg,
            clock: self.clock,
            events: OnceLock::new(),
            leadership: Published::default(),
            shutdown: shutdown.clone(),
            stopped: Default::default(),
            task: Mutex::new(None),
            failure: Mutex::new(None),
            presence,
            kinds_checked: Default::default(),
        });
        Ok(Elector { shared, _guard: Arc::new(shutdown.drop_guard()) })
    }
}

/// The acquire request of each slot of an election with several holders; none with one.
fn slot_requests(election: &ElectionName, holder: &HolderId, cfg: &Config) -> Result<Vec<AcquireRequest>, BuildError> {
    if cfg.holders <= 1 {
        return Ok(Vec::new());
    }
    if election.as_str().len() > crate::holders::MAX_HOLDERS_NAME {
        return Err(BuildError::Config(ConfigError {
            setting: "holders",
            reason: format!(
                "an election with several holders has a name of at most {} characters; {election} has {}",
                crate::holders::MAX_HOLDERS_NAME,
                election.as_str().len()
            ),
        }));
    }
    // The planted bug: one slot more than asked for, so that N + 1 hold at once.
    #[cfg(feature = "mutants")]
    let extra = cfg.mutation_extra_holder || crate::mutant("holders-one-extra");
    #[cfg(not(feature = "mutants"))]
    let extra = false;
    let n = if extra { cfg.holders + 1 } else { cfg.holders };
    (0..n)
        .map(|i| {
            Ok(AcquireRequest::new(crate::holders::slot_name(election, i)?, holder.clone(), cfg.ttl)
                .with_metadata(cfg.metadata.clone()))
        })
        .collect()
}

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

    /// Waits until the campaign task, if it was started, has ended.
    async fn stopped(&self) {
        let started = self.shared.task.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        if started {
            self.shared.stopped.wait().await;
        }
    }
}

/// Proof of leadership, handed to the leader's work. Clone it freely.
///
/// The lease is released only after every clone has been dropped, so keep one for
/// exactly as long as the guarded work runs.
#[derive(Clone)]
pub struct Leadership {
    term: Arc<Term>,
    cancel: CancellationToken,
}

struct Term {
    election: ElectionName,
    holder: HolderId,
    /// The holder's token: the lease's, or with several holders the slot's as
    /// [`crate::holders::holder_token`] makes it.
    token: crate::FencingToken,
    /// The slot held, with several holders; 0 with one.
    index: u32,
    /// How many hold the election at once ([`Config::holders`]).
    holders: u32,
    /// What the leader publishes, as last proclaimed.
    metadata: Mutex<Vec<u8>>,
    deadline: Arc<Mutex<Instant>>,
    clock: Arc<dyn Clock>,
    /// The lease TTL, for how long an unhealthy leader stands aside.
    ttl: Duration,
    /// The presence lease's candidate, to publish health with.
    presence: Option<Elector>,
    /// Resignations and proclamations for the lead loop.
    asks: Arc<Asks>,
    /// Told when the last clone is dropped; the runtime waits for that before releasing.
    gone: Arc<tokio::sync::Notify>,
}

impl Drop for Term {
    fn drop(&mut self) {
        // Kept as a permit if the runtime is not waiting yet.
        self.gone.notify_one();
    }
}

/// What the holders of a term ask of its lead loop. A queue under a lock rather than
/// channels: a channel keeps a block of slots, and a process may hold thousands of terms.
#[derive(Default)]
struct Asks {
    state: Mutex<AsksState>,
    changed: tokio::sync::Notify,
}

#[derive(Default)]
struct AsksState {
    resign: Vec<Resign>,
    proclaim: std::collections::VecDeque<Proclaim>,
    /// The term is ending: proclamations are refused.
    proclaim_closed: bool,
    /// The lead loop is done with the term: everything is refused.
    closed: bool,
}

impl Asks {
    fn lock(&self) -> std::sync::MutexGuard<'_, AsksState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a resignation; gives it back once the lead loop is done with the term.
    fn resign(&self, r: Resign) -> Result<(), Resign> {
        let mut s = self.lock();
        if s.closed {
            return Err(r);
        }
        s.resign.push(r);
        drop(s);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Queues a proclamation; gives it back once the term is ending.
    fn proclaim(&self, p: Proclaim) -> Result<(), Proclaim> {
        let mut s = self.lock();
        if s.closed || s.proclaim_closed {
            return Err(p);
        }
        s.proclaim.push_back(p);
        drop(s);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Waits until `take` finds something.
    async fn next<T>(&self, take: impl Fn(&mut AsksState) -> Option<T>) -> T {
        once_seen(&self.changed, || take(&mut self.lock())).await
    }

    /// Refuses proclamations from now on; answers those still queued.
    fn end_proclaims(&self) {
        let queued = {
            let mut s = self.lock();
            s.proclaim_closed = true;
            std::mem::take(&mut s.proclaim)
        };
        for p in queued {
            let _ = p.done.send(Err(ProclaimError::TermEnded));
        }
    }

    /// Refuses everything from now on; the resignations still queued.
    fn close(&self) -> Vec<Resign> {
        let mut s = self.lock();
        s.closed = true;
        std::mem::take(&mut s.resign)
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.term.election)
            .field("token", &self.term.token)
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Leadership {
    /// The fencing token of this term. Pass it with every write to a fenced resource.
    pub fn token(&self) -> crate::FencingToken {
        self.term.token
    }

    /// The election.
    pub fn election(&self) -> &ElectionName {
        &self.term.election
    }

    /// Which of the election's holders this is: 0 to [`Config::holders`] − 1, so that
    /// holders can split the work; always 0 with one holder.
    pub fn holder_index(&self) -> u32 {
        self.term.index
    }

    /// How many hold the election at once ([`Config::holders`]): 1 unless several do.
    pub fn holders(&self) -> u32 {
        self.term.holders
    }

    /// This leader's holder id.
    pub fn holder(&self) -> &HolderId {
        &self.term.holder
    }

    /// Who leads, as observers see it.
    pub fn leader(&self) -> Leader {
        let metadata = self.term.metadata.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Leader { holder: self.term.holder.clone(), token: self.term.token, metadata }
    }

    /// The local deadline: the lease certainly holds before this instant. It moves
    /// forward on every successful renewal.
    pub fn deadline(&self) -> Instant {
        *self.term.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left before [`Leadership::deadline`], zero once it has passed or the term ended.
    pub fn remaining(&self) -> Duration {
        if self.cancel.is_cancelled() {
            return Duration::ZERO;
        }
        self.deadline().saturating_duration_since(self.term.clock.now())
    }

    /// Whether this term still holds: not stepped down and before the deadline.
    /// Check it right before acting; pass the token to the resource as well, since
    /// the process can pause between the check and the act.
    pub fn is_valid(&self) -> bool {
        !self.cancel.is_cancelled() && self.term.clock.now() < self.deadline()
    }

    /// Completes when the term ends (step-down, loss, eviction, shutdown).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// A token cancelled when the term ends, for use with tokio-util's cancellation tree.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.child_token()
    }

    /// Steps down at once and hands over: the term is cancelled, and the lease is
    /// released as soon as every other clone of this leadership has been dropped.
    /// Returns after the release. Do not call it while holding another clone in the
    /// same task: it would wait for that clone forever.
    pub async fn resign(self) {
        self.resign_for(Duration::ZERO).await
    }

    /// Like [`Leadership::resign`], and then stands aside for at least `stand_aside`
    /// (or [`Config::resign_backoff`], if longer) before campaigning again, so that
    /// another candidate takes over: what a leader does when it finds itself unhealthy.
    /// A stand-aside of one TTL lets even candidates that poll find the lease free.
    pub async fn resign_for(self, stand_aside: Duration) {
        let (tx, rx) = oneshot::channel();
        let sent = self.term.asks.resign(Resign { done: tx, stand_aside }).is_ok();
        drop(self);
        if sent {
            let _ = rx.await;
        }
    }
}

impl Leadership {
    /// Publishes `metadata` in place of what this leader published so far, within the
    /// term: the token stays, observers and watchers see the new value (etcd's
    /// `Proclaim`). It is sent to the store as a renewal (a same-holder acquire, store
    /// duty 4), so it also extends the term, dated from its send time like any renewal.
    /// Returns once the store has answered.
    pub async fn set_metadata(&self, metadata: impl Into<Vec<u8>>) -> Result<(), ProclaimError> {
        let metadata = metadata.into();
        if metadata.len() > crate::store::MAX_METADATA {
            return Err(ProclaimError::TooLarge(metadata.len()));
        }
        if self.cancel.is_cancelled() {
            return Err(ProclaimError::TermEnded);
        }
        let (tx, rx) = oneshot::channel();
        self.term.asks.proclaim(Proclaim { metadata, done: tx }).map_err(|_| ProclaimError::TermEnded)?;
        rx.await.unwrap_or(Err(ProclaimError::TermEnded))
    }

    /// Publishes this leader's health with its presence, for `tenure status` and
    /// [`crate::candidates`] (one store call). Without [`Config::announce`] there is no
    /// presence to publish it with, and it does nothing. [`ProclaimError::TermEnded`]
    /// means the presence lease is not held right now (it is being renewed back).
    pub async fn set_health(&self, health: crate::Health) -> Result<(), ProclaimError> {
        let Some(presence) = &self.term.presence else { return Ok(()) };
        let Some(l) = presence.current() else { return Err(ProclaimError::TermEnded) };
        l.set_metadata(crate::presence::with_health(&presence.config().metadata, health)).await
    }

    /// Starts a watchdog over the guarded work, for a leader that keeps renewing while
    /// its work is stuck: unless [`Watchdog::progress`] is called at least every
    /// `within`, the leader resigns and stands aside for one TTL, so that a healthy
    /// replica takes over. Off unless started; dropping the watchdog stops it, and it
    /// ends with the term.
    pub fn watchdog(&self, within: Duration) -> Watchdog {
        let clock = self.term.clock.clone();
        let (tx, mut rx) = tokio::sync::watch::channel(clock.now());
        let l = self.clone();
        let task = tokio::spawn(async move {
            let mut last = *rx.borrow_and_update();
            loop {
                tokio::select! {
                    // The term is over: let the lease go without us.
                    _ = l.cancelled() => return,
                    changed = rx.changed() => match changed {
                        Ok(()) => last = *rx.borrow_and_update(),
                        Err(_) => return,
                    },
                    _ = l.term.clock.sleep_until(last + within) => {
                        tracing::warn!(election = %l.election(), token = %l.token(), ?within,
                            "the guarded work reported no progress in time; resigning so that a healthy replica leads");
                        let ttl = l.term.ttl;
                        l.resign_for(ttl).await;
                        return;
                    }
                }
            }
        });
        Watchdog { clock, progress: tx, task }
    }
}

/// Resigns the leadership it watches unless the guarded work reports progress in time;
/// see [`Leadership::watchdog`].
pub struct Watchdog {
    clock: Arc<dyn Clock>,
    progress: tokio::sync::watch::Sender<Instant>,
    task: tokio::task::JoinHandle<()>,
}

impl Watchdog {
    /// The guarded work is making progress: the time allowed starts again from now.
    pub fn progress(&self) {
        self.progress.send_replace(self.clock.now());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request to publish new metadata: answered once the store has.
struct Proclaim {
    metadata: Vec<u8>,
    done: oneshot::Sender<Result<(), ProclaimError>>,
}

/// What the holders of a term asked of its lead loop.
enum Ask {
    Resign(Resign),
    Proclaim(Proclaim),
}

/// A request to resign: answered once the lease is released.
struct Resign {
    done: oneshot::Sender<()>,
    /// How long to stand aside before campaigning again (at least the resign backoff).
    stand_aside: Duration,
}

/// Ends the campaign's outward state when the campaign task ends, however it ends.
struct Stopped<'a>(&'a Shared);

impl Stopped<'_> {
    fn finish(shared: &Shared, crashed: bool) {
        // A campaign that stopped stops announcing itself too.
        if let Some(p) = &shared.presence {
            p.shared.shutdown.cancel();
        }
        if crashed {
            let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
            f.get_or_insert(ElectError::Crashed);
        }
        if let Some(l) = shared.leadership.replace(None) {
            l.cancel.cancel();
        }
        shared.stopped.set();
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        Stopped::finish(self.0, true);
    }
}

/// The leadership handed out, and a wake-up for those waiting for it to change: a `watch`
/// channel would do, at several times the size, in every elector of a process.
#[derive(Default)]
struct Published {
    current: Mutex<Option<Leadership>>,
    changed: tokio::sync::Notify,
}

impl Published {
    fn get(&self) -> Option<Leadership> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Publishes `l`; returns what was published before.
    fn replace(&self, l: Option<Leadership>) -> Option<Leadership> {
        let old = std::mem::replace(&mut *self.current.lock().unwrap_or_else(|p| p.into_inner()), l);
        self.changed.notify_waiters();
        old
    }
}

/// A flag that is set once, and waited for: a `watch` channel would do, at ten times the
/// size, in every elector of a process that may hold thousands.
#[derive(Default)]
struct Flag {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Flag {
    fn set(&self) {
        self.set.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    async fn wait(&self) {
        once_seen(&self.notify, || self.set.load(std::sync::atomic::Ordering::SeqCst).then_some(())).await
    }
}

/// Waits until `look` finds something, looking again each time `notify` wakes it. The
/// wake-up is registered before each look, so a change made after a look is not missed.
async fn once_seen<T>(notify: &tokio::sync::Notify, mut look: impl FnMut() -> Option<T>) -> T {
    loop {
        let changed = notify.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if let Some(x) = look() {
            return x;
        }
        changed.await;
    }
}

/// A revision of a lease, and the earliest end the readings of it gave.
type Reading = (crate::store::Revision, Instant);

/// Tracks the leader this candidate last reported, to emit each change once.
struct View<'a> {
    shared: &'a Shared,
    leader: Option<Option<(HolderId, crate::FencingToken)>>,
    /// While following: when the last live lease seen would end, and when the store said
    /// there was none; how long the election then had no leader, once this one won.
    lease_ends: Option<Instant>,
    vacant_since: Option<Instant>,
    takeover: Option<Duration>,
    /// The grant of the last live lease seen while following, and for each of its last
    /// few revisions when it would end as far as the readings tell (see [`View::ends`]).
    seen: Option<(HolderId, crate::FencingToken, Vec<Reading>)>,
}

impl View<'_> {
    /// Another holder's live lease, seen while following: the election will have no
    /// leader once it ends, unless the store reports it gone sooner.
    fn live(&mut self, rec: &LeaseRecord) {
        if rec.evicted {
            return;
        }
        self.lease_ends = Some(self.ends(rec));
        self.vacant_since = None;
    }

    /// When the lease `rec` ends, as far as this candidate can tell: the time left the
    /// store reported, counted from now. A reading tells the time left when the store
    /// made it, so the later it arrives the later the end it gives: a watch that catches
    /// up after a partition delivers the renewals it missed, each with a whole TTL left,
    /// after this candidate has read the latest one itself. Of the readings of one
    /// revision of a grant, whose end at the store is one, the earliest counts.
    fn ends(&mut self, rec: &LeaseRecord) -> Instant {
        /// Revisions remembered per grant: enough for the renewals a catching-up watch
        /// delivers after a read, few enough to look through at each event.
        const REMEMBERED: usize = 8;
        let end = self.shared.clock.now() + rec.remaining.unwrap_or(rec.ttl);
        if crate::mutant("latest-reading-counts") {
            return end;
        }
        let same_grant = matches!(&self.seen, Some((h, t, _)) if *h == rec.holder && *t == rec.token);
        if !same_grant {
            self.seen = Some((rec.holder.clone(), rec.token, Vec::with_capacity(REMEMBERED)));
        }
        let Some((_, _, revisions)) = &mut self.seen else { return end };
        match revisions.iter_mut().find(|(r, _)| *r == rec.revision) {
            Some((_, earlier)) => {
                *earlier = (*earlier).min(end);
                *earlier
            }
            None => {
                if revisions.len() == REMEMBERED {
                    revisions.remove(0);
                }
                revisions.push((rec.revision, end));
                end
            }
        }
    }

    /// This candidate won: how long the election had no leader, as far as it saw.
    fn won(&mut self) {
        let now = self.shared.clock.now();
        let ended = match (self.vacant_since, self.lease_ends) {
            (Some(v), _) => Some(v),
            (None, Some(end)) if end <= now => Some(end),
            _ => None,
        };
        self.takeover = ended.map(|e| now.saturating_duration_since(e));
        self.lease_ends = None;
        self.vacant_since = None;
    }

    fn saw(&mut self, leader: Option<Leader>) {
        if self.shared.cfg.holders > 1 {
            // Several lead: there is no one leader to tell of.
            return;
        }
        let key = leader.as_ref().map(|l| (l.holder.clone(), l.token));
        if self.leader.as_ref() != Some(&key) {
            self.leader = Some(key);
            self.shared.send_event(Event::LeaderChanged(leader));
        }
    }

    fn saw_record(&mut self, rec: Option<&LeaseRecord>) {
        self.saw(rec.map(LeaseRecord::leader));
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

async fn next_event(watch: &mut Option<WatchStream>) -> Option<Result<Option<LeaseRecord>, StoreError>> {
    match watch {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// What a leader's watch reported.
enum LeaderWatch {
    /// This term's record.
    Ours,
    /// Someone else's record, an eviction, or no lease: the store must be asked.
    Ask,
    /// The watch failed or ended.
    Ended,
}

/// The leader's next watch report, judged against its `lease`. Small on purpose: it is
/// what a leader's select keeps between reports, for every election the process leads.
async fn leader_watch(watch: &mut Option<WatchStream>, lease: &LeaseRecord) -> LeaderWatch {
    match next_event(watch).await {
        Some(Ok(Some(rec))) if rec.holder == lease.holder && rec.token == lease.token && !rec.evicted => {
            LeaderWatch::Ours
        }
        Some(Ok(_)) => LeaderWatch::Ask,
        Some(Err(_)) | None => LeaderWatch::Ended,
    }
}

/// The follower phase: campaigns until this candidate holds the lease. `None` on shutdown.
/// Until `defer`, it leaves a free lease to the successor it was reserved for, reading
/// instead of acquiring, until it sees anyone hold the lease.
async fn follow(shared: &Shared, view: &mut View<'_>, mut defer: Option<Instant>) -> Option<(LeaseRecord, Instant)> {
    let cfg = &shared.cfg;
    let me = &shared.req.holder;
    let mut watch = shared.store.watch(&shared.req.election);
    // After an ambiguous acquire we must read before we act.
    let mut unresolved = false;
    let mut attempt = true;
    let mut wake_at = shared.clock.now();
    let mut failures = Failures::new(&shared.req.election);
    view.lease_ends = None;
    view.vacant_since = None;
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(stop_following(shared, unresolved.then_some(&shared.req.election))).await;
            return None;
        }
        if attempt {
            attempt = false;
            let sent = shared.clock.now();
            let until = sent + cfg.request_timeout;
            let retry_at = sent + cfg.jittered(cfg.retry_period);
            defer = defer.filter(|d| *d > sent);
            if let Some(reserved_until) = defer
                && !unresolved
            {
                match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // Ours (a give-back that did not land, an acquire applied late), and
                        // nothing runs under it: give it back again, and look again later.
                        let _ = call(shared, "release", until, shared.store.release(&rec)).await;
                        wake_at = retry_at.min(reserved_until);
                    }
                    Ok(Some(rec)) => {
                        // Someone leads: the reservation has done its work.
                        defer = None;
                        failures.reset();
                        view.saw_record(Some(&rec));
                        view.live(&rec);
                        wake_at = follower_wake(shared, view, Some(&rec), watch.is_some());
                    }
                    Ok(None) => {
                        // Free: leave it only while it is still reserved for a live candidate.
                        // Boxed: a rare path, and the largest future a follower awaits.
                        let reserved =
                            Box::pin(call(shared, "list", until, Standing::read(&*shared.store, &shared.req.election)))
                                .await
                                .map(|st| matches!(st.successor(me, cfg.priority), Some(Successor::Reserved { .. })));
                        if let Ok(false) = reserved {
                            defer = None;
                            attempt = true;
                        } else {
                            // The successor's presence can end without a word on the
                            // election's watch: look again within a retry period.
                            wake_at = reserved_until.min(retry_at);
                        }
                    }
                    Err(e) => {
                        failures.note(&e, "reading the lease failed", shared.clock.now());
                        wake_at = retry_at.min(reserved_until);
                    }
                }
            } else if unresolved {
                match call(shared, "get", until, shared.store.get(&shared.req.election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // A read cannot tell which of our writes produced this record,
                        // so confirm it with a compare-and-set renewal and date the
                        // term from that request.
                        let sent = shared.clock.now();
                        let until = sent + cfg.request_timeout;
                        match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                            Ok(Renew::Renewed(lease)) => {
                                view.won();
                                return Some((lease, sent));
                            }
                            Ok(Renew::Lost(cur)) => {
                                unresolved = false;
                                view.saw_record(cur.as_ref());
                                wake_at = follower_wake(shared, view, cur.as_ref(), watch.is_some());
                            }
                            Err(e) => {
                                failures.note(&e, "confirming a maybe-held lease failed", shared.clock.now());
                                wake_at = retry_at;
                            }
                        }
                    }
                    Ok(cur) => {
                        unresolved = false;
                        view.saw_record(cur.as_ref());
                        wake_at = if cur.is_none() {
                            shared.clock.now()
                        } else {
                            follower_wake(shared, view, cur.as_ref(), watch.is_some())
                        };
                        attempt = cur.is_none();
                    }
                    Err(e) => {
                        failures.note(&e, "reading the lease failed", shared.clock.now());
                        wake_at = retry_at;
                    }
                }
            } else {
                match call(shared, "acquire", until, shared.store.try_acquire(&shared.req)).await {
                    Ok(Acquire::Acquired(lease)) => {
                        view.won();
                        return Some((lease, sent));
                    }
                    Ok(Acquire::Held(cur)) => {
                        failures.reset();
                        view.saw_record(Some(&cur));
                        view.live(&cur);
                        wake_at = follower_wake(shared, view, Some(&cur), watch.is_some());
                    }
                    Err(e) if !e.is_retryable() => {
                        tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                        let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                        *f = Some(ElectError::Store(Arc::new(e)));
                        return None;
                    }
                    Err(e) => {
                        if e.kind() == ErrorKind::Ambiguous {
                            unresolved = true;
                        }
                        failures.note(&e, "acquire failed", shared.clock.now());
                        wake_at = retry_at;
                    }
                }
            }
            if attempt {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => {
                Box::pin(stop_following(shared, unresolved.then_some(&shared.req.election))).await;
                return None;
            }
            _ = shared.clock.sleep_until(wake_at) => attempt = true,
            ev = next_event(&mut watch) => match ev {
                Some(Ok(None)) => {
                    view.saw(None);
                    view.vacant_since.get_or_insert(shared.clock.now());
                    attempt = true;
                }
                Some(Ok(Some(rec))) => {
                    if rec.holder == *me && !rec.evicted {
                        // Ours (a late echo, or a maybe-applied acquire): resolve it.
                        attempt = true;
                        unresolved = true;
                    } else if !unresolved {
                        defer = None;
                        view.saw_record(Some(&rec));
                        view.live(&rec);
                        wake_at = follower_wake(shared, view, Some(&rec), true);
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(election = %shared.req.election, error = %e, "watch failed; polling");
                    watch = None;
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
                None => {
                    watch = None;
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
            },
        }
    }
}

/// A follower stops. With an acquire whose answer never came (`unresolved`: the election
/// or slot it was for; it may have been granted, and nothing runs under it), the record is
/// read, and released if it is this holder's,
/// so that the next candidate need not wait a TTL for it (nor, on a store whose elections
/// share one lease per process, as long as the process keeps that alive).
async fn stop_following(shared: &Shared, unresolved: Option<&ElectionName>) {
    if let Some(election) = unresolved
        && !crate::mutant("stop-leaves-unresolved-grant")
    {
        let until = shared.clock.now() + shared.cfg.request_timeout;
        match call(shared, "get", until, shared.store.get(election)).await {
            Ok(Some(rec)) if rec.holder == shared.req.holder => give_back(shared, &rec).await,
            Ok(_) => {}
            Err(e) => tracing::debug!(election = %shared.req.election, error = %e,
                "stopping: could not read what an unanswered acquire did; a grant it made will expire on its own"),
        }
    }
}

/// The follower phase with several holders ([`Config::holders`]): campaigns until this
/// candidate holds one of the slots, and answers its index. `None` on shutdown.
///
/// It holds at most one slot: it tries the slots that are not known to be held one at a
/// time, from a random one on (so that candidates started together spread over them),
/// and after an acquire whose answer never came it tries no other slot before a read has
/// told whether that one was granted. Between rounds it waits for a slot's watch to
/// report a change, or for the earliest moment a slot it saw held would expire.
async fn follow_slots(shared: &Shared) -> Option<(u32, LeaseRecord, Instant)> {
    let cfg = &shared.cfg;
    let me = &shared.req.holder;
    let n = shared.slots.len();
    let mut watches = tokio_stream::StreamMap::new();
    for (i, slot) in shared.slots.iter().enumerate() {
        if let Some(w) = shared.store.watch(&slot.election) {
            // A watch that ends says so, as an error, so that its slot is polled from then
            // on (the map would drop it without a word).
            let ended = tokio_stream::once(Err(StoreError::unavailable("the watch ended")));
            let w: WatchStream = Box::pin(tokio_stream::StreamExt::chain(w, ended));
            watches.insert(i, w);
        }
    }
    let watching = |w: &tokio_stream::StreamMap<usize, WatchStream>, i: usize| w.contains_key(&i);
    // When each slot, last seen held by another, would expire; `None`: try it.
    let mut held_until: Vec<Option<Instant>> = vec![None; n];
    // The grant and revision each end was read from: of the readings of one revision,
    // the earliest end counts (a watch catching up late gives later ones; see `View::ends`).
    let mut read_from: Vec<Option<(HolderId, crate::FencingToken, crate::store::Revision)>> = vec![None; n];
    let mut saw = |i: usize, rec: &LeaseRecord, held_until: &mut Vec<Option<Instant>>| {
        let end = shared.clock.now() + rec.remaining.unwrap_or(rec.ttl);
        let from = Some((rec.holder.clone(), rec.token, rec.revision));
        held_until[i] = match held_until[i] {
            Some(earlier) if read_from[i] == from => Some(earlier.min(end)),
            _ => Some(end),
        };
        read_from[i] = from;
    };
    // A slot whose acquire may have been granted without an answer: read it first.
    let mut unresolved: Option<usize> = None;
    let mut failures = Failures::new(&shared.req.election);
    let mut attempt = true;
    let mut wake_at = shared.clock.now();
    loop {
        if shared.shutdown.is_cancelled() {
            Box::pin(stop_following(shared, unresolved.map(|i| &shared.slots[i].election))).await;
            return None;
        }
        if attempt {
            attempt = false;
            let now = shared.clock.now();
            let retry_at = now + cfg.jittered(cfg.retry_period);
            wake_at = retry_at;
            if let Some(i) = unresolved {
                let until = now + cfg.request_timeout;
                match call(shared, "get", until, shared.store.get(&shared.slots[i].election)).await {
                    Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                        // Confirm it with a compare-and-set renewal, and date the term from it.
                        let sent = shared.clock.now();
                        let until = sent + cfg.request_timeout;
                        match call(shared, "renew", until, shared.store.renew(&rec, cfg.ttl)).await {
                            Ok(Renew::Renewed(lease)) => return Some((i as u32, lease, sent)),
                            Ok(Renew::Lost(_)) => unresolved = None,
                            Err(e) => failures.note(&e, "confirming a maybe-held slot failed", shared.clock.now()),
                        }
                    }
                    Ok(_) => unresolved = None,
                    Err(e) => failures.note(&e, "reading a slot failed", shared.clock.now()),
                }
                if unresolved.is_some() {
                    // Still unknown: try again after a retry period, and nothing else meanwhile.
                    wake_at = retry_at;
                } else {
                    attempt = true;
                }
            } else {
                let first = fastrand::usize(..n);
                for k in 0..n {
                    let i = (first + k) % n;
                    // A slot seen held waits for its end where a watch would tell of a
                    // change. One not watched is asked at each wake (a retry period), as a
                    // follower of one lease asks: where the store does not say how long a
                    // grant has left (an Azure blob lease), the end is a guess of a TTL from
                    // the reading, and a renewal read at that guess would put it off again.
                    if held_until[i].is_some_and(|t| t > shared.clock.now())
                        && (watching(&watches, i) || crate::mutant("slot-unwatched-unpolled"))
                    {
                        continue;
                    }
                    if shared.shutdown.is_cancelled() {
                        break;
                    }
                    let sent = shared.clock.now();
                    let until = sent + cfg.request_timeout;
                    match call(shared, "acquire", until, shared.store.try_acquire(&shared.slots[i])).await {
                        Ok(Acquire::Acquired(lease)) => return Some((i as u32, lease, sent)),
                        Ok(Acquire::Held(cur)) => {
                            failures.reset();
                            saw(i, &cur, &mut held_until);
                        }
                        Err(e) if !e.is_retryable() => {
                            tracing::error!(election = %shared.req.election, error = %e, "the store refused; no retry can help, so campaigning stops");
                            let mut f = shared.failure.lock().unwrap_or_else(|p| p.into_inner());
                            *f = Some(ElectError::Store(Arc::new(e)));
                            return None;
                        }
                        Err(e) => {
                            failures.note(&e, "acquire failed", shared.clock.now());
                            if e.kind() == ErrorKind::Ambiguous {
                                unresolved = Some(i);
                            }
                            // The store is failing: the other slots wait for the retry,
                            // rather than a request timeout each, now.
                            if !crate::mutant("slot-wake-unfloored") {
                                held_until[i] = None;
                            }
                            break;
                        }
                    }
                }
                // Wake when the first slot seen held would expire (no later than a poll
                // period for a slot not watched), or after a retry period for a slot not
                // seen held: one whose acquire failed, or whose holder's time ran out.
                let now = shared.clock.now();
                wake_at = (0..n)
                    .map(|i| match held_until[i] {
                        Some(t) if t > now && watching(&watches, i) => t,
                        Some(t) if t > now => t.min(retry_at),
                        _ => retry_at,
                    })
                    .min()
                    .unwrap_or(retry_at)
                    .max(now + cfg.retry_period / 10);
                // The planted bug: every slot seen held and watched, wake at the earliest
                // end seen, however long ago it passed.
                if crate::mutant("slot-wake-unfloored") && held_until.iter().all(|t| t.is_some()) && watches.len() == n
                {
                    wake_at = held_until.iter().flatten().copied().min().unwrap_or(retry_at);
                }
            }
            if attempt {
                continue;
            }
        }
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => {
                Box::pin(stop_following(shared, unresolved.map(|i| &shared.slots[i].election))).await;
                return None;
            }
            _ = shared.clock.sleep_until(wake_at) => attempt = true,
            Some((i, ev)) = tokio_stream::StreamExt::next(&mut watches) => match ev {
                Ok(Some(rec)) if rec.holder == *me && !rec.evicted => {
                    // Ours (a late echo, or a maybe-applied acquire): resolve it.
                    unresolved.get_or_insert(i);
                    attempt = true;
                }
                Ok(Some(rec)) => saw(i, &rec, &mut held_until),
                Ok(None) => {
                    held_until[i] = None;
                    attempt = true;
                }
                Err(e) => {
                    tracing::debug!(election = %shared.req.election, slot = i, error = %e, "watch failed; polling");
                    watches.remove(&i);
                    wake_at = wake_at.min(shared.clock.now() + cfg.retry_period);
                }
            },
        }
    }
}

/// Logs store failures: a warning for the first of a run, then at debug level, so that a
/// long outage does not flood the log, with a reminder at warning level after 10 s, 1 min
/// and 5 min of failing, and every 5 min after that, so that a replica waiting on a store
/// it cannot reach does not fall silent.
struct Failures<'a> {
    election: &'a ElectionName,
    run: u32,
    /// When the run began, and the next reminder's place in [`REMINDERS`].
    since: Option<crate::Instant>,
    reminded: usize,
}

/// When a run of failures is reminded of, after it began (the last one again and again).
const REMINDERS: [Duration; 3] = [Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(300)];

impl<'a> Failures<'a> {
    fn new(election: &'a ElectionName) -> Self {
        Self { election, run: 0, since: None, reminded: 0 }
    }

    /// A failure of `what` at `now`.
    fn note(&mut self, e: &StoreError, what: &str, now: crate::Instant) {
        self.run += 1;
        let since = *self.since.get_or_insert(now);
        let due = self.reminder_after();
        // With its causes: "cannot connect" alone does not say "connection refused".
        let error = error_chain(e);
        if self.run == 1 {
            tracing::warn!(election = %self.election, %error, "{what}; retrying (further failures are logged at debug level)");
        } else if now.saturating_duration_since(since) >= due {
            self.reminded += 1;
            tracing::warn!(
                election = %self.election, %error, failures = self.run,
                "{what}; still failing after {} (retrying)",
                humanize(now.saturating_duration_since(since))
            );
        } else {
            tracing::debug!(election = %self.election, %error, failures = self.run, "{what}");
        }
    }

    /// How long after the run began the next reminder is due.
    fn reminder_after(&self) -> Duration {
        match REMINDERS.get(self.reminded) {
            Some(d) => *d,
            None => REMINDERS[REMINDERS.len() - 1] * (self.reminded as u32 - REMINDERS.len() as u32 + 2),
        }
    }

    fn reset(&mut self) {
        if self.run > 1 {
            tracing::info!(election = %self.election, failures = self.run, "the store answers again");
        }
        self.run = 0;
        self.since = None;
        self.reminded = 0;
    }
}

/// `d` in whole seconds, or minutes past a minute, for log lines.
fn humanize(d: Duration) -> String {
    match d.as_secs() {
        s if s < 60 => format!("{s} s"),
        s => format!("{} min {} s", s / 60, s % 60),
    }
}

/// Why a term ends when the store answers that `lease` is no longer this grant: evicted
/// (then `lease` becomes the record as it now stands, whose revision moved, to release),
/// or lost to `cur`'s holder, or to nobody.
fn lost(lease: &mut LeaseRecord, cur: Option<LeaseRecord>) -> StepDownReason {
    match cur {
        Some(r) if r.holder == lease.holder && r.token == lease.token && r.evicted => {
            *lease = r;
            StepDownReason::Evicted
        }
        other => StepDownReason::Lost { to: other.map(|r| r.leader()) },
    }
}

/// Releases `lease` and checks: a renewal that timed out may still have been applied and
/// moved the revision, which makes the release match nothing; then the record as it
/// stands is released, and read again, until it is gone or another's: a store may apply
/// more than one renewal late (a batch goes on with its rounds after its caller gave up),
/// each just before a release. A record of this holder with another token is a grant of
/// ours that landed late (a proclamation's acquire): released too, since this candidate
/// leads nothing while it releases. The check is made even when the release failed (it
/// may have timed out, or gone in a batch that failed), so that the lease does not live
/// on, which on a store whose elections share one lease per process lasts as long as the
/// process. All of it within [`RELEASE_TIMEOUTS`] request timeouts, and every path ends on
/// a read. True if the lease is gone; false if another holds it, or if it still stood
/// when the checks ran out (logged).
async fn release(shared: &Shared, lease: &LeaseRecord) -> Result<bool, StoreError> {
    let timeout = shared.cfg.request_timeout;
    let end = shared.clock.now() + timeout * RELEASE_TIMEOUTS;
    let until = || (shared.clock.now() + timeout).min(end);
    let mut released = call(shared, "release", until(), shared.store.release(lease)).await;
    let mut checks = if crate::mutant("release-checked-once") { 1 } else { RELEASE_CHECKS };
    loop {
        if shared.clock.now() >= end {
            return Err(StoreError::timed_out("release and its check", timeout * RELEASE_TIMEOUTS));
        }
        let now = match call(shared, "get", until(), shared.store.get(&lease.election)).await {
            Ok(now) => now,
            Err(e) => return Err(released.err().unwrap_or(e)),
        };
        match now {
            Some(cur) if cur.holder == lease.holder => {
                if checks == 0 {
                    // Why it still stands: the store refused the releases (a full disk, a
                    // read-only server), or they were applied and renewals given up on
                    // kept landing behind them.
                    match &released {
                        Err(e) => tracing::warn!(election = %lease.election, token = %cur.token,
                            "the lease still stands: releasing it failed {} times, the last time with: {}; it will expire on its own",
                            RELEASE_CHECKS + 1, error_chain(e)),
                        Ok(()) => tracing::warn!(election = %lease.election, token = %cur.token,
                            "the lease still stands after releasing it {} times (renewals given up on kept landing late); it will expire on its own",
                            RELEASE_CHECKS + 1),
                    }
                    return Ok(false);
                }
                checks -= 1;
                released = call(shared, "release", until(), shared.store.release(&cur)).await;
            }
            Some(_) => return Ok(false),
            None => return Ok(true),
        }
    }
}

/// `e` and its sources, as one line.
fn error_chain(e: &StoreError) -> String {
    let mut out = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = c.source();
    }
    out
}

/// How many times a release releases the record again after reading it still ours: each
/// late renewal that lands just before a release costs one.
const RELEASE_CHECKS: usize = 3;

/// How many request timeouts a release may take in all, whatever the store does.
const RELEASE_TIMEOUTS: u32 = 3;

/// When a follower that saw `rec` should try again: when the record would expire,
/// and no later than one poll period if the store cannot tell it of changes.
fn follower_wake(shared: &Shared, view: &mut View<'_>, rec: Option<&LeaseRecord>, watching: bool) -> Instant {
    let cfg = &shared.cfg;
    let now = shared.clock.now();
    let floor = now + cfg.retry_period / 10;
    let expiry = match rec {
        Some(r) => view.ends(r),
        None => now,
    };
    let wake = if watching { expiry } else { expiry.min(now + cfg.jittered(cfg.retry_period)) };
    wake.max(floor)
}

/// The leader phase: renews until the term ends, then steps down and releases.
/// Leads until the term ends; returns why, and how long a resigner asked to stand aside.
async fn lead(
    shared: &Shared,
    view: &mut View<'_>,
    slot: Option<u32>,
    lease: &mut LeaseRecord,
    sent: Instant,
    unhealthy: &mut u32,
) -> (StepDownReason, Duration) {
    let cfg = &shared.cfg;
    // The lease this term holds: the election's, or a slot's.
    let election = &lease.election.clone();
    let index = slot.unwrap_or(0);
    let token = match slot {
        Some(i) => crate::holders::holder_token(lease.token, i),
        None => lease.token,
    };
    // The safety rule: a term is dated from when its acquire or renewal was *sent*. The
    // store dates its expiry from when it *received* the request (store duty 2), which is
    // later, so `sent + ttl·(1 − max_drift) − safety_margin` falls before the store's
    // expiry on any clock within the drift bound (docs/ARCHITECTURE.md, "Why two leaders
    // never overlap", steps 1 and 2). Dating it from the answer's arrival would not.
    let dated = |sent: Instant| {
        #[cfg(feature = "mutants")]
        if cfg.mutation_date_from_response {
            return shared.clock.now();
        }
        sent
    };
    // Through a store that gathers renewals, renew early on its grid, so they meet.
    let grid = shared.store.renewal_grid();
    let term_times = |sent: Instant| {
        let mut t = TermTimes::after_success(cfg, dated(sent));
        if let Some(origin) = grid {
            t.renew_at = on_grid(t.renew_at, t.sent, origin, cfg.renew_interval);
        }
        t
    };
    let mut times = term_times(sent);
    let deadline_cell = Arc::new(Mutex::new(times.deadline));
    // A renewal (or proclamation) sent at `sent` succeeded: the term runs on from then.
    let renewed = |times: &mut TermTimes, sent: Instant| {
        *times = term_times(sent);
        *deadline_cell.lock().unwrap_or_else(|p| p.into_inner()) = times.deadline;
        shared.metrics.remaining(times.deadline.saturating_duration_since(shared.clock.now()));
    };
    // An announcing winner first asks whether the election belongs to someone else; nothing
    // has been handed out yet, so if it does, the lease goes back at once.
    if cfg.announce && slot.is_none() {
        let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
        match Box::pin(successor(shared, until)).await {
            Some(Successor::Reserved { to, remaining }) => {
                tracing::info!(%election, successor = %to, "won, but the election is reserved for another candidate; giving it back");
                Box::pin(give_back(shared, lease)).await;
                return (StepDownReason::HandedOver { to }, remaining.min(cfg.ttl));
            }
            Some(Successor::Higher(to)) => {
                tracing::info!(%election, successor = %to, "won, but a candidate of higher priority campaigns; handing over to it");
                Box::pin(reserve(shared, &to)).await;
                Box::pin(give_back(shared, lease)).await;
                return (StepDownReason::HandedOver { to }, cfg.ttl);
            }
            None => {}
        }
    }
    // One holder and several are different records in the store, so a winner of the other
    // kind would run beside them: it looks before its term is handed out, and if it finds
    // that kind holding, gives the lease back and stops campaigning.
    let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
    if let Some(why) = Box::pin(other_kind(shared, slot, until)).await {
        tracing::error!(election = %shared.req.election, "{why}; campaigning stops");
        Box::pin(give_back(shared, lease)).await;
        *shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(ElectError::Unsupported(why));
        return (StepDownReason::ShuttingDown, Duration::ZERO);
    }
    let cancel = CancellationToken::new();
    let asks = Arc::new(Asks::default());
    let gone = Arc::new(tokio::sync::Notify::new());
    let mut pending = Some(Leadership {
        term: Arc::new(Term {
            election: shared.req.election.clone(),
            holder: shared.req.holder.clone(),
            token,
            index,
            holders: cfg.holders,
            metadata: Mutex::new(lease.metadata.clone()),
            deadline: deadline_cell.clone(),
            clock: shared.clock.clone(),
            ttl: cfg.ttl,
            presence: shared.presence.clone(),
            asks: asks.clone(),
            gone: gone.clone(),
        }),
        cancel: cancel.clone(),
    });
    let publish_at = sent + cfg.cool_down;
    let mut watch = shared.store.watch(election);
    note!(shared, election = %shared.req.election, %token, holder_index = ?slot, "elected");
    view.saw_record(Some(&*lease));
    let mut resigners: Vec<Resign> = Vec::new();
    // A proclamation answered by a grant of a new term, to release after the work stops.
    let mut release_new_grant = false;
    // The successor to reserve the election for, after the work stops and before the release.
    let mut reserve_for: Option<HolderId> = None;

    let reason = loop {
        // After a pause (SIGSTOP, a stalled VM) these may already have passed.
        let now = shared.clock.now();
        if now >= times.deadline {
            break StepDownReason::DeadlinePassed;
        }
        if now >= times.stop_at {
            break StepDownReason::RenewFailed;
        }
        let publish_wait = async {
            match pending {
                // Without a cool-down it is already due: hand it out now, not at the timer's
                // next tick (up to a millisecond on every handover).
                Some(_) if shared.clock.now() >= publish_at => {}
                Some(_) => shared.clock.sleep_until(publish_at).await,
                None => std::future::pending().await,
            }
        };
        // One timer for both: the renewal is due no later than the step-down time, and a
        // renewal woken at or past that time steps down instead.
        let renew_due_at = times.renew_at.min(times.stop_at);
        tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break StepDownReason::ShuttingDown,
            // One waiter for both kinds of ask, as it is kept by every leader between
            // renewals. A resignation goes first; a proclamation waits while a renewal is
            // due, so that proclamations that keep failing cannot starve the renewal.
            ask = asks.next(|s| {
                s.resign.pop().map(Ask::Resign).or_else(|| {
                    let renewal_due = shared.clock.now() >= renew_due_at;
                    if renewal_due { None } else { s.proclaim.pop_front().map(Ask::Proclaim) }
                })
            }) => match ask {
                Ask::Resign(tx) => {
                    resigners.push(tx);
                    break StepDownReason::Resigned;
                }
                Ask::Proclaim(p) => {
                    let sent = shared.clock.now();
                    if sent >= times.stop_at {
                        let _ = p.done.send(Err(ProclaimError::TermEnded));
                        continue;
                    }
                    let req = AcquireRequest::new(election.clone(), shared.req.holder.clone(), cfg.ttl)
                        .with_metadata(p.metadata.clone());
                    let until = times.stop_at.min(sent + cfg.request_timeout);
                    match call(shared, "proclaim", until, shared.store.try_acquire(&req)).await {
                        // A same-holder acquire is a renewal: the same term, dated from its send time.
                        Ok(Acquire::Acquired(rec)) if rec.token == lease.token => {
                            *lease = rec;
                            renewed(&mut times, sent);
                            if let Some(l) = shared.leadership.get() {
                                *l.term.metadata.lock().unwrap_or_else(|p| p.into_inner()) = p.metadata;
                            }
                            let _ = p.done.send(Ok(()));
                        }
                        Ok(Acquire::Acquired(grant)) => {
                            // A new grant: the store had ended this term. This process does not
                            // lead in it: the work stops first (the step-down below), then the
                            // grant, which keeps everyone else out meanwhile, is released.
                            let _ = p.done.send(Err(ProclaimError::TermEnded));
                            *lease = grant;
                            release_new_grant = true;
                            break StepDownReason::Lost { to: None };
                        }
                        Ok(Acquire::Held(cur)) => {
                            let _ = p.done.send(Err(ProclaimError::TermEnded));
                            break lost(lease, Some(cur));
                        }
                        Err(e) => {
                            tracing::warn!(%election, error = %e, "publishing new metadata failed");
                            let _ = p.done.send(Err(ProclaimError::Store(e)));
                        }
                    }
                }
            },
            _ = publish_wait => {
                // Woken late (a pause during a cool-down): the top of the loop steps down
                // instead of announcing a term that is already over.
                if shared.clock.now() >= times.stop_at {
                    continue;
                }
                if let Some(l) = pending.take() {
                    shared.metrics.elected(view.takeover.take());
                    shared.metrics.remaining(times.deadline.saturating_duration_since(shared.clock.now()));
                    shared.send_event(Event::Elected { token: l.token() });
                    shared.leadership.replace(Some(l));
                }
            }
            _ = shared.clock.sleep_until(renew_due_at) => {
                let sent = shared.clock.now();
                // Woken late (a pause): no time is left to renew in.
                if sent >= times.deadline {
                    break StepDownReason::DeadlinePassed;
                }
                if sent >= times.stop_at {
                    break StepDownReason::RenewFailed;
                }
                let until = times.stop_at.min(sent + cfg.request_timeout);
                match call(shared, "renew", until, shared.store.renew(lease, cfg.ttl)).await {
                    Ok(Renew::Renewed(rec)) => {
                        *lease = rec;
                        renewed(&mut times, sent);
                        if cfg.announce && slot.is_none() {
                            let until = times.stop_at.min(shared.clock.now() + cfg.request_timeout);
                            match Box::pin(successor(shared, until)).await {
                                // A reservation made during this term: an operator's handover.
                                Some(Successor::Reserved { to, .. }) => {
                                    tracing::info!(%election, successor = %to, "the election was reserved for another candidate; handing over");
                                    break StepDownReason::HandedOver { to };
                                }
                                Some(Successor::Higher(to)) => {
                                    tracing::info!(%election, successor = %to, "a candidate of higher priority campaigns; handing over to it");
                                    #[cfg(feature = "mutants")]
                                    if cfg.mutation_hand_over_without_stepping_down {
                                        // The planted bug: give the lease away and lead on.
                                        Box::pin(reserve(shared, &to)).await;
                                        Box::pin(give_back(shared, lease)).await;
                                        continue;
                                    }
                                    reserve_for = Some(to.clone());
                                    break StepDownReason::HandedOver { to };
                                }
                                None => {}
                            }
                        }
                    }
                    Ok(Renew::Lost(cur)) => break lost(lease, cur),
                    Err(e) => {
                        tracing::warn!(%election, error = %e, "renewal failed; retrying");
                        let now = shared.clock.now();
                        if now >= times.stop_at {
                            break StepDownReason::RenewFailed;
                        }
                        times.renew_at = (now + cfg.jittered(cfg.retry_period)).min(times.stop_at);
                    }
                }
            }
            seen = leader_watch(&mut watch, lease) => match seen {
                LeaderWatch::Ours => {}
                LeaderWatch::Ask => {
                    // Someone else's record, an eviction, or none at all: ask the store
                    // with a renewal, whose answer is authoritative.
                    times.renew_at = shared.clock.now();
                }
                LeaderWatch::Ended => watch = None,
            },
        }
    };

    // Step down: end the term, wait for the guarded work, then release.
    cancel.cancel();
    // A proclamation sent meanwhile is answered now: its caller may hold the leadership
    // that the release below waits for.
    asks.end_proclaims();
    drop(pending);
    shared.leadership.replace(None);
    note!(shared, election = %shared.req.election, %token, holder_index = ?slot, ?reason, "stepped down");
    shared.metrics.ended(&reason);
    shared.send_event(Event::SteppedDown { reason: reason.clone() });
    // Warn if the work outlives the deadline, unless we only woke up past it.
    let mut warned = shared.clock.now() >= times.deadline;
    loop {
        tokio::select! {
            biased;
            _ = gone.notified() => break,
            _ = shared.clock.sleep_until(times.deadline), if !warned => {
                warned = true;
                tracing::error!(%election, token = %lease.token,
                    "the guarded work is still running past the lease deadline; drop every Leadership clone when it is cancelled");
            }
        }
    }
    resigners.extend(asks.close());
    let mut stand_aside = resigners.iter().map(|r| r.stand_aside).max().unwrap_or_default();
    if let Some(to) = &reserve_for {
        Box::pin(reserve(shared, to)).await;
    }
    // A candidate that stops or stands aside withdraws its presence before the release,
    // so that the next winner does not find it announced and hand the election back to it.
    // An unhealthy one stays away longer each time in a row.
    let resigned_unhealthy = reason == StepDownReason::Resigned && !stand_aside.is_zero();
    *unhealthy = if resigned_unhealthy { unhealthy.saturating_add(1) } else { 0 };
    match (&reason, &shared.presence) {
        (StepDownReason::ShuttingDown, Some(p)) => {
            p.shared.shutdown.cancel();
            // Its release and the reads that confirm it (see `release`), a read before them when
            // it stops as a follower with an acquire unanswered (`stop_following`), and a
            // little more.
            let until = shared.clock.now() + cfg.request_timeout * (RELEASE_TIMEOUTS + 2);
            tokio::select! {
                biased;
                _ = Box::pin(p.stopped()) => {}
                _ = shared.clock.sleep_until(until) => {}
            }
        }
        (StepDownReason::Resigned | StepDownReason::Evicted, Some(p)) => {
            let hold = cfg.resign_backoff.max(stand_aside).saturating_mul(2u32.pow((*unhealthy).clamp(1, 7) - 1));
            if let Some(presence) = p.current() {
                tracing::debug!(%election, ?hold, "standing aside: no longer announced meanwhile");
                let until = shared.clock.now() + cfg.request_timeout * (RELEASE_TIMEOUTS + 2);
                tokio::select! {
                    biased;
                    _ = Box::pin(presence.resign_for(hold)) => {}
                    _ = shared.clock.sleep_until(until) => {}
                }
            }
        }
        _ => {}
    }
    if !matches!(reason, StepDownReason::Lost { .. }) || release_new_grant {
        match Box::pin(release(shared, lease)).await {
            Ok(true) => view.saw(None),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(%election, error = %e, "release failed or could not be confirmed; the lease will expire on its own")
            }
        }
    }
    if let StepDownReason::Lost { to } = &reason {
        view.saw(to.clone());
    }
    if let StepDownReason::HandedOver { .. } = reason {
        // Leave the election to the successor while it is reserved for it.
        stand_aside = cfg.ttl;
    }
    for r in resigners {
        let _ = r.done.send(());
    }
    (reason, stand_aside)
}

/// Whether candidates of the other kind hold the election, as a winner sees it before its
/// term is handed out: for a slot's winner, the election's own lease (one `get`); for a
/// single winner, in its first term only, the slots (one `list`), since that kind can
/// only have joined since it started. A store that does not answer says nobody: the check
/// is a second line behind the command line's check at start, never a reason to wait.
async fn other_kind(shared: &Shared, slot: Option<u32>, until: Instant) -> Option<String> {
    let e = &shared.req.election;
    if e.as_str().starts_with(crate::RESERVED_PREFIX) || crate::mutant("kinds-unchecked") {
        return None;
    }
    match slot {
        Some(i) => match call(shared, "get", until, shared.store.get(e)).await {
            Ok(Some(r)) => Some(format!(
                "{e} is held by {} as its only holder, while this candidate won holder index {i} of {}; \
                 every candidate of an election needs the same number of holders",
                r.holder, shared.cfg.holders
            )),
            _ => None,
        },
        None if !shared.kinds_checked.swap(true, std::sync::atomic::Ordering::SeqCst) => {
            match call(shared, "list", until, crate::holders::holders(&*shared.store, e)).await {
                Ok(h) if !h.is_empty() => Some(format!(
                    "{} candidate(s) with several holders hold {e} (holder {}, index {}), while this candidate \
                     won it as its only holder; every candidate of an election needs the same number of holders",
                    h.len(),
                    h[0].record.holder,
                    h[0].index
                )),
                _ => None,
            }
        }
        None => None,
    }
}

/// Whom this announcing winner should give the election to, if anyone (one `list`). A
/// reservation that names this candidate has served its purpose and is ended. A store
/// that does not answer in time says nobody: priorities never hold up an election.
async fn successor(shared: &Shared, until: Instant) -> Option<Successor> {
    let me = &shared.req.holder;
    let standing = match call(shared, "list", until, Standing::read(&*shared.store, &shared.req.election)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(election = %shared.req.election, error = %e, "could not list the candidates");
            return None;
        }
    };
    let next = standing.successor(me, shared.cfg.priority);
    if next.is_none()
        && let Some(rec) = standing.reserved_for_me(me)
    {
        // Within the caller's time (a leader's step-down time): not a moment longer.
        let _ = call(shared, "release", until, shared.store.release(rec)).await;
    }
    next
}

/// Reserves the election for `to` for one TTL, so that no other announcing candidate
/// slips in between the release and the successor's acquire. Best effort: a reservation
/// that fails costs a handover, not safety.
async fn reserve(shared: &Shared, to: &HolderId) {
    let until = shared.clock.now() + shared.cfg.request_timeout;
    let r = crate::presence::reserve(&*shared.store, &shared.req.election, to, &shared.req.holder, shared.cfg.ttl);
    if let Err(e) = call(shared, "reserve", until, r).await {
        tracing::warn!(election = %shared.req.election, successor = %to, error = %e, "could not reserve the election for the successor; releasing anyway");
    }
}

/// Releases a lease under which no work ran.
async fn give_back(shared: &Shared, lease: &LeaseRecord) {
    if let Err(e) = release(shared, lease).await {
        tracing::warn!(election = %shared.req.election, error = %e, "release failed or could not be confirmed; the lease will expire on its own");
    }
}

/// The latest instant at or before `due` that is a whole number of `period`s after
/// `origin`, if it comes after `sent`; otherwise `due`. Never later than `due`.
fn on_grid(due: Instant, sent: Instant, origin: Instant, period: Duration) -> Instant {
    let period_ns = period.as_nanos();
    if period_ns == 0 || due <= origin {
        return due;
    }
    let since = (due - origin).as_nanos();
    let at = origin + Duration::from_nanos(u64::try_from(since - since % period_ns).unwrap_or(u64::MAX));
    if at > sent && at <= due { at } else { due }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_store_failures_is_reminded_of_after_10_s_1_min_5_min_and_every_5_min() {
        let e = ElectionName::new("e").unwrap();
        let mut f = Failures::new(&e);
        let t0 = crate::Instant::now();
        let err = StoreError::unavailable("down");
        let mut reminders = Vec::new();
        for s in 0..1300u64 {
            let before = f.reminded;
            f.note(&err, "acquire failed", t0 + Duration::from_secs(s));
            if f.reminded > before {
                reminders.push(s);
            }
        }
        assert_eq!(reminders, [10, 60, 300, 600, 900, 1200]);
        f.reset();
        assert_eq!((f.run, f.reminded, f.since), (0, 0, None));
    }
}
