//! Gathering the renewals of many electors into few store calls.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::name::ElectionName;
use crate::record::{Acquire, AcquireRequest, Evict, ExpiryJudge, LeaseRecord, Renew};
use crate::store::{LeaseStore, StoreError, WatchStream};

/// How long [`Batched`] gathers renewals by default before it sends them.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(10);
/// The most renewals [`Batched`] sends in one call by default.
pub const DEFAULT_MAX_BATCH: usize = 4096;

/// A store wrapper that gathers the renewals of every elector using it into
/// [`LeaseStore::renew_many`] calls: a process that leads thousands of elections on one
/// store renews them in a few round trips per renew interval instead of one each.
///
/// A renewal waits at most the window (10 ms by default) for others to join it. That is
/// safe: the runtime dates a term from before it called `renew`, so waiting only makes it
/// believe it leads for less time than the store grants. Electors also renew early on a
/// grid shared by every elector using the handle ([`LeaseStore::renewal_grid`]): those
/// with the same TTL renew at the same instants, so 10,000 elections take a few calls per
/// renew interval. Every other call goes straight to the wrapped store.
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
    /// The origin of the renewal grid.
    origin: crate::Instant,
}

struct Job {
    held: LeaseRecord,
    ttl: Duration,
    reply: oneshot::Sender<Result<Renew, StoreError>>,
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
            origin: crate::Instant::now(),
        }
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
/// then sends each TTL's jobs in one `renew_many`, without waiting for the answer
/// before gathering the next batch. Ends when every [`Batched`] handle is gone.
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
        // A caller that gave up waiting (its renewal timed out) needs no store work.
        batch.retain(|j| !j.reply.is_closed());
        let mut by_ttl: BTreeMap<Duration, Vec<Job>> = BTreeMap::new();
        for j in batch {
            by_ttl.entry(j.ttl).or_default().push(j);
        }
        for (ttl, jobs) in by_ttl {
            let store = store.clone();
            tokio::spawn(async move {
                let held: Vec<LeaseRecord> = jobs.iter().map(|j| j.held.clone()).collect();
                let mut answers = store.renew_many(&held, ttl).await;
                if answers.len() != jobs.len() {
                    let e = StoreError::ambiguous(format!(
                        "{} answered {} renewals for {}",
                        store.describe(),
                        answers.len(),
                        jobs.len()
                    ));
                    answers = jobs.iter().map(|_| Err(e.duplicate())).collect();
                }
                for (job, answer) in jobs.into_iter().zip(answers) {
                    let _ = job.reply.send(answer);
                }
            });
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for Batched {
    async fn try_acquire(&self, req: &AcquireRequest) -> Result<Acquire, StoreError> {
        self.inner.try_acquire(req).await
    }

    async fn renew(&self, held: &LeaseRecord, ttl: Duration) -> Result<Renew, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job { held: held.clone(), ttl, reply };
        if self.queue().send(job).is_err() {
            return Err(StoreError::unavailable(
                "the renewal batcher has stopped: the async runtime that first renewed through this \
                 Batched store has shut down; create the Batched store in the runtime that uses it",
            ));
        }
        answer.await.unwrap_or_else(|_| Err(StoreError::ambiguous("the renewal batch was dropped")))
    }

    async fn renew_many(&self, held: &[LeaseRecord], ttl: Duration) -> Vec<Result<Renew, StoreError>> {
        self.inner.renew_many(held, ttl).await
    }

    async fn release(&self, held: &LeaseRecord) -> Result<(), StoreError> {
        self.inner.release(held).await
    }

    async fn get(&self, election: &ElectionName) -> Result<Option<LeaseRecord>, StoreError> {
        self.inner.get(election).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LeaseRecord>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn evict(&self, election: &ElectionName, how: Evict) -> Result<Option<LeaseRecord>, StoreError> {
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

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
