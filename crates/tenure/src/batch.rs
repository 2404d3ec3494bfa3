//! Gathering the renewals of many electors into few store calls.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::name::{ElectionName, WorkKey};
use crate::record::{Acquire, AcquireRequest, Evict, ExpiryJudge, LeaseRecord, Renew};
use crate::store::{LeaseStore, LedgerEntry, LedgerWrite, StoreError, WatchStream};

/// How long [`Batched`] gathers renewals by default before it sends them.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(10);
/// The most renewals [`Batched`] sends in one call by default.
pub const DEFAULT_MAX_BATCH: usize = 4096;
/// The most other calls (acquires, reads, evictions) [`Batched`] lets run at once by
/// default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// A store wrapper that gathers the renewals of every elector using it into
/// [`LeaseStore::renew_many`] calls, and their releases into
/// [`LeaseStore::release_many`] calls: a process that leads thousands of elections on one
/// store renews them in a few round trips per renew interval instead of one each, and
/// hands them all over in a few round trips when it stops.
///
/// A renewal waits at most the window (10 ms by default) for others to join it. That is
/// safe: the runtime dates a term from before it called `renew`, so waiting only makes it
/// believe it leads for less time than the store grants. Electors also renew early on a
/// grid shared by every elector using the handle ([`LeaseStore::renewal_grid`]): those
/// with the same TTL renew at the same instants, so 10,000 elections take a few calls per
/// renew interval. A release waits the same window, and is sent even if its caller
/// stops waiting (it only frees the election sooner). Every other call goes to the
/// wrapped store as it comes, at most [`DEFAULT_MAX_IN_FLIGHT`] at once: when 10,000
/// electors stop together, each reads its election after its release, and a store
/// client's call can take 15 KiB while it waits for a pooled connection (300 MB at once
/// on PostgreSQL); a call waiting for its turn holds a few bytes.
///
/// ```no_run
/// # async fn t(store: std::sync::Arc<dyn tenure::LeaseStore>) -> Result<(), Box<dyn std::error::Error>> {
/// let shared: std::sync::Arc<dyn tenure::LeaseStore> = std::sync::Arc::new(tenure::Batched::new(store));
/// for i in 0..10_000 {
///     tenure::Elector::builder(shared.clone(), format!("shard/{i}")).build()?.start();
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Batched {
    inner: Arc<dyn LeaseStore>,
    window: Duration,
    max_batch: usize,
    queue: Arc<OnceLock<mpsc::UnboundedSender<Job>>>,
    /// Turns for the calls that go straight to the wrapped store.
    turns: Arc<tokio::sync::Semaphore>,
    /// The origin of the renewal grid.
    origin: crate::Instant,
}

/// A renewal or a release waiting for its batch.
enum Job {
    Renew { held: LeaseRecord, ttl: Duration, reply: oneshot::Sender<Result<Renew, StoreError>> },
    Release { held: LeaseRecord, reply: oneshot::Sender<Result<(), StoreError>> },
}

impl Job {
    /// Whether the caller gave up waiting on a renewal (its request timed out): then no
    /// store work. A release is sent even then: its compare makes it harmless if the
    /// holder took the lease back since, and otherwise it frees the election a TTL sooner.
    fn abandoned(&self) -> bool {
        match self {
            Job::Renew { reply, .. } => reply.is_closed(),
            Job::Release { .. } => false,
        }
    }
}

impl Batched {
    /// Wraps `store` with the default window and batch size.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self::with_window(store, DEFAULT_WINDOW, DEFAULT_MAX_BATCH)
    }

    /// Wraps `store`: renewals wait up to `window` for others, and at most `max_batch`
    /// (at least 1) go in one call.
    pub fn with_window(store: Arc<dyn LeaseStore>, window: Duration, max_batch: usize) -> Self {
        Self {
            inner: store,
            window,
            max_batch: max_batch.max(1),
            queue: Arc::new(OnceLock::new()),
            turns: Arc::new(tokio::sync::Semaphore::new(DEFAULT_MAX_IN_FLIGHT)),
            origin: crate::Instant::now(),
        }
    }

    /// Lets at most `n` (at least 1) calls other than renewals and releases run at once
    /// (default [`DEFAULT_MAX_IN_FLIGHT`]); the others wait for a turn. Fewer turns, less
    /// memory when thousands of electors start, stop or take over at once; more turns,
    /// sooner takeovers of thousands of elections on a store far away (each turn is a
    /// round trip). Set it before cloning the handle: each clone keeps its own turns.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.turns = Arc::new(tokio::sync::Semaphore::new(n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)));
        self
    }

    /// Waits for a turn to call the wrapped store directly. The semaphore is never
    /// closed, so a turn always comes.
    async fn turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.turns.acquire().await.ok()
    }

    /// Queues a job for the gathering task.
    fn enqueue(&self, job: Job) -> Result<(), StoreError> {
        self.queue().send(job).map_err(|_| {
            StoreError::unavailable(
                "the batcher has stopped: the async runtime that first renewed or released through \
                 this Batched store has shut down; create the Batched store in the runtime that uses it",
            )
        })
    }

    /// The queue, with its gathering task started on first use (inside the runtime).
    fn queue(&self) -> &mpsc::UnboundedSender<Job> {
        self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(gather(self.inner.clone(), rx, self.window, self.max_batch));
            tx
        })
    }
}

/// Gathers jobs for `window` after the first one arrives (or until `max` are waiting),
/// then sends each TTL's renewals in one `renew_many` and the releases in one
/// `release_many`, without waiting for the answers before gathering the next batch. Ends
/// when every [`Batched`] handle is gone.
async fn gather(store: Arc<dyn LeaseStore>, mut rx: mpsc::UnboundedReceiver<Job>, window: Duration, max: usize) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::sleep(window);
        tokio::pin!(until);
        while batch.len() < max {
            tokio::select! {
                biased;
                j = rx.recv() => match j {
                    Some(j) => batch.push(j),
                    None => break,
                },
                _ = &mut until => break,
            }
        }
        batch.retain(|j| !j.abandoned());
        let mut by_ttl: BTreeMap<Duration, Vec<_>> = BTreeMap::new();
        let mut releases = Vec::new();
        for j in batch {
            match j {
                Job::Renew { held, ttl, reply } => by_ttl.entry(ttl).or_default().push((held, reply)),
                Job::Release { held, reply } => releases.push((held, reply)),
            }
        }
        for (ttl, jobs) in by_ttl {
            let store = store.clone();
            tokio::spawn(answer(jobs, "renewals", async move |held| store.renew_many(held, ttl).await));
        }
        if !releases.is_empty() {
            let store = store.clone();
            tokio::spawn(answer(releases, "releases", async move |held| store.release_many(held).await));
        }
    }
}

/// Sends one batch through `call` and answers each caller with its own result; a store
/// that answers the wrong number of results leaves every caller with an ambiguous error.
async fn answer<T>(
    jobs: Vec<(LeaseRecord, oneshot::Sender<Result<T, StoreError>>)>,
    what: &str,
    call: impl AsyncFnOnce(&[LeaseRecord]) -> Vec<Result<T, StoreError>>,
) {
    let (held, replies): (Vec<LeaseRecord>, Vec<_>) = jobs.into_iter().unzip();
    let mut answers = call(&held).await;
    if answers.len() != replies.len() {
        let e = StoreError::ambiguous(format!("the store answered {} {what} for {}", answers.len(), replies.len()));
        answers = replies.iter().map(|_| Err(e.duplicate())).collect();
    }
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
}

#[async_trait::async_trait]
impl LeaseStore for Batched {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        let _turn = self.turn().await;
        self.inner.try_acquire(req).await
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Job::Renew { held: held.clone(), ttl, reply })?;
        answer.await.unwrap_or_else(|_| Err(StoreError::ambiguous("the renewal batch was dropped")))
    }

    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        self.inner.renew_many(held, ttl).await
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Job::Release { held: held.clone(), reply })?;
        answer.await.unwrap_or_else(|_| Err(StoreError::ambiguous("the release batch was dropped")))
    }

    async fn release_many(&self, held: &[LeaseRecord]) -> Vec<Result<(), StoreError>> {
        self.inner.release_many(held).await
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        let _turn = self.turn().await;
        self.inner.get(election).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        let _turn = self.turn().await;
        self.inner.list(prefix).await
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
        let _turn = self.turn().await;
        self.inner.evict(election, how).await
    }

    fn watch(&self, election: &ElectionName) -> Option<WatchStream> {
        self.inner.watch(election)
    }

    fn expiry(&self) -> ExpiryJudge {
        self.inner.expiry()
    }

    fn renewal_grid(&self) -> Option<crate::Instant> {
        Some(self.origin)
    }

    fn watch_reports_expiry(&self) -> bool {
        self.inner.watch_reports_expiry()
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn ledger_read(&self, election: &ElectionName, key: &WorkKey) -> Result<Option<LedgerEntry>, StoreError> {
        let _turn = self.turn().await;
        self.inner.ledger_read(election, key).await
    }

    async fn ledger_write(
        &self,
        election: &ElectionName,
        key: &WorkKey,
        value: &[u8],
        expected: Option<&str>,
        keep: Duration,
    ) -> Result<LedgerWrite, StoreError> {
        let _turn = self.turn().await;
        self.inner.ledger_write(election, key, value, expected, keep).await
    }
}
