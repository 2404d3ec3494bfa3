//! The native part of tenure's Python package (`tenure._tenure`): campaigns, leaderships,
//! observers and once-per-key runs on tenure's Rust runtime. The Python module `tenure`
//! wraps it in context managers (`tenure.lead`), asyncio and the exception classes;
//! read that module for the API.
//!
//! Every wait releases the GIL and wakes every 50 ms to let Python handle signals, so a
//! Ctrl-C (`KeyboardInterrupt`) ends it. The Rust runtime is one tokio runtime per
//! process, made on first use, and made again in a child after `fork` (the parent's
//! threads do not exist there).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tenure::ledger::{Guarantee, Policy};
use tenure::{ElectError, Elector, ErrorKind, Event, Leader, StoreError, WorkKey};

/// How often a wait with the GIL released looks for Python signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The process's runtime, and the process it was made in.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

/// The runtime of this process, made on first use (and again in a forked child).
fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    let pid = std::process::id();
    if let Some((made_in, rt)) = slot.as_ref()
        && *made_in == pid
    {
        return Ok(rt.clone());
    }
    // A runtime made before a fork has no threads here: it is left, never dropped
    // (dropping it would wait for threads that do not exist).
    if let Some(old) = slot.take() {
        std::mem::forget(old);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tenure")
        .enable_all()
        .build()
        .map_err(|e| error("misconfigured", format!("cannot start tenure's runtime: {e}")))?;
    let rt = Arc::new(rt);
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// A `tenure.TenureError` (the class is the Python module's) with `kind`.
fn error(kind: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let made = py
            .import("tenure")
            .and_then(|m| m.getattr("TenureError"))
            .and_then(|class| class.call1((message.clone(), kind)));
        match made {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        }
    })
}

/// The name of an error kind, as `TenureError.kind` gives it.
fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Ambiguous => "ambiguous",
        ErrorKind::Invalid => "invalid",
        ErrorKind::Unauthorized => "unauthorized",
        ErrorKind::Misconfigured => "misconfigured",
        _ => "other",
    }
}

/// A message with its whole chain of causes, each said once.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn store_error(e: &StoreError) -> PyErr {
    error(kind_name(e.kind()), chain(e))
}

fn elect_error(e: ElectError) -> PyErr {
    match &e {
        ElectError::Store(inner) => error(kind_name(inner.kind()), format!("{e}: {}", chain(&**inner))),
        ElectError::ShutDown => error("shut_down", e.to_string()),
        _ => error("other", chain(&e)),
    }
}

/// A holder id for `name` that no other process given the same name shares (a
/// suffix of its own is added), so that two processes given one name never take
/// each other's lease for their own.
fn instance(name: &str) -> PyResult<String> {
    tenure::HolderId::instance_of(name).map(|h| h.to_string()).map_err(|e| error("invalid", e.to_string()))
}

/// A duration in seconds from Python, refused unless finite and within `(0, 1 year]`.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if !(s.is_finite() && s > 0.0 && s <= 365.0 * 86_400.0) {
        return Err(error("invalid", format!("{what} must be a positive number of seconds (got {s})")));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Runs `fut` on the runtime with the GIL released, waking every [`SIGNAL_POLL`] to
/// let Python raise a pending signal (`KeyboardInterrupt`), which ends the wait.
fn block_on<T: Send>(py: Python<'_>, fut: impl std::future::Future<Output = T> + Send) -> PyResult<T> {
    let rt = runtime()?;
    let mut fut = std::pin::pin!(fut);
    loop {
        let polled = py.detach(|| {
            rt.block_on(async {
                tokio::select! {
                    out = &mut fut => Some(out),
                    _ = tokio::time::sleep(SIGNAL_POLL) => None,
                }
            })
        });
        if let Some(out) = polled {
            return Ok(out);
        }
        py.check_signals()?;
    }
}

/// `fut`, given up after `limit` (the timer is made on the runtime, when first polled).
async fn within<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(limit, fut).await
}

/// CLOCK_MONOTONIC in seconds: the clock of Python's `time.monotonic()` on Linux.
fn monotonic_now() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// Opens the store a URL names, as the `tenure` command does.
fn open_store(py: Python<'_>, url: &str) -> PyResult<Arc<dyn tenure::LeaseStore>> {
    let url = url.to_string();
    block_on(py, async move { tenure_stores::connect(&url).await })?.map_err(|e| store_error(&e))
}

/// A leader as a dict: `holder`, `token`, `metadata` (bytes).
fn leader_dict<'py>(py: Python<'py>, l: &Leader) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("holder", l.holder.as_str())?;
    d.set_item("token", l.token.0)?;
    d.set_item("metadata", pyo3::types::PyBytes::new(py, &l.metadata))?;
    Ok(d)
}

/// One candidate's campaign in an election, in the background from the moment it is made.
#[pyclass(module = "tenure._tenure")]
struct Campaign {
    elector: Elector,
    events: Mutex<tokio::sync::broadcast::Receiver<Event>>,
}

#[pymethods]
impl Campaign {
    /// Opens the store and starts campaigning.
    #[new]
    #[pyo3(signature = (store, election, ttl, holder=None, metadata=None))]
    fn new(
        py: Python<'_>,
        store: &str,
        election: &str,
        ttl: f64,
        holder: Option<&str>,
        metadata: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let ttl = seconds("ttl", ttl)?;
        let store = open_store(py, store)?;
        let mut builder = Elector::builder(store, election).ttl(ttl);
        if let Some(h) = holder {
            builder = builder.holder(instance(h)?);
        }
        if let Some(m) = metadata {
            builder = builder.metadata(m);
        }
        let elector = builder.build().map_err(|e| error("invalid", chain(&e)))?;
        let rt = runtime()?;
        let _entered = rt.enter();
        let events = Mutex::new(elector.events());
        elector.start();
        Ok(Self { elector, events })
    }

    /// This candidate's holder id.
    #[getter]
    fn holder(&self) -> String {
        self.elector.holder().to_string()
    }

    /// The election's name.
    #[getter]
    fn election(&self) -> String {
        self.elector.election().to_string()
    }

    /// Waits until this candidate leads, at most `timeout` seconds (None: for ever).
    /// Returns the leadership, or None when the time ran out.
    #[pyo3(signature = (timeout=None))]
    fn wait_elected(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Leadership>> {
        let wait = self.elector.leadership();
        let got = match timeout {
            None => block_on(py, wait)?,
            Some(t) if t <= 0.0 => match self.elector.current() {
                Some(l) => Ok(l),
                None => return Ok(None),
            },
            Some(t) => match block_on(py, within(seconds("timeout", t)?, wait))? {
                Ok(got) => got,
                Err(_) => return Ok(None),
            },
        };
        got.map(|l| Some(Leadership::new(l))).map_err(elect_error)
    }

    /// The leadership if this candidate leads right now, else None.
    fn current(&self) -> Option<Leadership> {
        self.elector.current().map(Leadership::new)
    }

    /// Whether the campaign works (it has not stopped on an error no retry mends).
    fn is_healthy(&self) -> bool {
        self.elector.is_healthy()
    }

    /// The next event, waiting at most `timeout` seconds (None: for ever); None when the
    /// time ran out. An event is a tuple: `("elected", token)`, `("stepped_down",
    /// reason)`, `("leader_changed", leader dict or None)`, or `("missed", count)` when
    /// the reader fell behind.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        let limit = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let mut rx = self.events.lock().unwrap_or_else(|p| p.into_inner()).resubscribe_keep();
        let got = block_on(py, async move {
            let r = match limit {
                None => Some(rx.recv().await),
                Some(d) => tokio::time::timeout(d, rx.recv()).await.ok(),
            };
            (r, rx)
        })?;
        let (r, rx) = got;
        *self.events.lock().unwrap_or_else(|p| p.into_inner()) = rx;
        use tokio::sync::broadcast::error::RecvError;
        let value = match r {
            None => return Ok(None),
            Some(Ok(Event::Elected { token })) => ("elected", token.0).into_pyobject(py)?.into_any().unbind(),
            Some(Ok(Event::SteppedDown { reason })) => {
                ("stepped_down", reason.name()).into_pyobject(py)?.into_any().unbind()
            }
            Some(Ok(Event::LeaderChanged(l))) => {
                let leader = l.as_ref().map(|l| leader_dict(py, l)).transpose()?;
                ("leader_changed", leader).into_pyobject(py)?.into_any().unbind()
            }
            // A kind of event this version does not know by name.
            Some(Ok(other)) => ("other", format!("{other:?}")).into_pyobject(py)?.into_any().unbind(),
            Some(Err(RecvError::Lagged(n))) => ("missed", n).into_pyobject(py)?.into_any().unbind(),
            Some(Err(RecvError::Closed)) => return Err(error("shut_down", "the campaign has ended".into())),
        };
        Ok(Some(value))
    }

    /// Stops campaigning: ends the current term (if any), releases the lease at once
    /// so that another candidate is elected without waiting for the TTL, and returns
    /// once it is released. Every `Leadership` of it is over by then.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let elector = self.elector.clone();
        block_on(py, async move { elector.shutdown().await })
    }
}

/// The events receiver's trick: a receiver is moved into the wait and back, so that a
/// wait ended by a signal loses its place in the queue no more than a resubscription.
trait KeepReceiver {
    fn resubscribe_keep(&mut self) -> Self;
}

impl<T: Clone> KeepReceiver for tokio::sync::broadcast::Receiver<T> {
    fn resubscribe_keep(&mut self) -> Self {
        let fresh = self.resubscribe();
        std::mem::replace(self, fresh)
    }
}

/// Proof of leadership for one term: its fencing token, its deadline, whether it is
/// still valid. While the term is on, it holds it (the runtime releases a lease only
/// once no one holds its term): `release()` lets go (the context manager does), and the
/// term's end lets go by itself, so that a leadership kept in a Python variable never
/// holds up a release, a shutdown or the next campaign.
#[pyclass(module = "tenure._tenure")]
struct Leadership {
    term: Arc<Mutex<Option<tenure::Leadership>>>,
    token: u64,
    holder: String,
    election: String,
}

impl Leadership {
    fn new(l: tenure::Leadership) -> Self {
        let term = Arc::new(Mutex::new(Some(l.clone())));
        // Lets go of the term once it ends (lost, evicted, resigned, shut down, past
        // its deadline): the runtime ends every term through its cancellation.
        if let Ok(rt) = runtime() {
            let held = Arc::downgrade(&term);
            let ends = l.clone();
            rt.spawn(async move {
                ends.cancelled().await;
                drop(ends);
                if let Some(held) = held.upgrade() {
                    held.lock().unwrap_or_else(|p| p.into_inner()).take();
                }
            });
        }
        Self { token: l.token().0, holder: l.holder().to_string(), election: l.election().to_string(), term }
    }

    fn term(&self) -> Option<tenure::Leadership> {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[pymethods]
impl Leadership {
    /// The term's fencing token: pass it to every resource the leader writes to.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// This candidate's holder id.
    #[getter]
    fn holder(&self) -> &str {
        &self.holder
    }

    /// The election's name.
    #[getter]
    fn election(&self) -> &str {
        &self.election
    }

    /// Seconds left until the local deadline (0 once the term is over).
    fn remaining(&self) -> f64 {
        match self.term() {
            Some(l) if l.is_valid() => l.remaining().as_secs_f64(),
            _ => 0.0,
        }
    }

    /// The local deadline on the clock of `time.monotonic()`: the term is over by then
    /// unless renewed (each renewal moves it). Work that must not outlive the term stops
    /// before it.
    #[getter]
    fn deadline(&self) -> f64 {
        monotonic_now() + self.remaining()
    }

    /// Whether the term is still on: false from the moment it ends early (lost,
    /// evicted, resigned, unhealthy), or its deadline passes, or it is released.
    fn is_valid(&self) -> bool {
        self.term().is_some_and(|l| l.is_valid())
    }

    /// Waits until the term ends, at most `timeout` seconds (None: for ever); returns
    /// whether it ended.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let Some(l) = self.term() else { return Ok(true) };
        let ends = async move {
            // Ended early, or its deadline passed without a renewal moving it.
            while l.is_valid() {
                tokio::select! {
                    _ = l.cancelled() => break,
                    _ = tokio::time::sleep(l.remaining().min(Duration::from_millis(100))) => {}
                }
            }
        };
        match timeout {
            None => block_on(py, ends).map(|_| true),
            Some(t) => Ok(block_on(py, within(seconds("timeout", t)?, ends))?.is_ok()),
        }
    }

    /// Lets go of the term: `is_valid()` is false from now on, and the campaign may
    /// release the lease (it is released only once no leadership of it is held).
    fn release(&self) {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// Publishes new metadata (bytes) with the lease, for observers to read.
    fn set_metadata(&self, py: Python<'_>, metadata: Vec<u8>) -> PyResult<()> {
        let Some(l) = self.term() else { return Err(error("term_ended", "the term has ended".into())) };
        match block_on(py, async move { l.set_metadata(metadata).await })? {
            Ok(()) => Ok(()),
            Err(tenure::ProclaimError::Store(e)) => Err(store_error(&e)),
            Err(e) => Err(error("term_ended", e.to_string())),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Leadership(election={:?}, holder={:?}, token={}, valid={})",
            self.election,
            self.holder,
            self.token,
            self.is_valid()
        )
    }
}

/// Who leads an election, for processes that do not campaign.
#[pyclass(module = "tenure._tenure")]
struct Observer {
    inner: Arc<tokio::sync::Mutex<tenure::Observer>>,
}

#[pymethods]
impl Observer {
    /// Opens the store and starts watching the election.
    #[new]
    fn new(py: Python<'_>, store: &str, election: &str) -> PyResult<Self> {
        let store = open_store(py, store)?;
        let name = tenure::ElectionName::new(election).map_err(|e| error("invalid", e.to_string()))?;
        let rt = runtime()?;
        let _entered = rt.enter();
        let observer = tenure::observe(store, name);
        Ok(Self { inner: Arc::new(tokio::sync::Mutex::new(observer)) })
    }

    /// The leader as last seen (a dict with `holder`, `token`, `metadata`), or None.
    fn leader<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let inner = self.inner.clone();
        let l = block_on(py, async move { inner.lock().await.current() })?;
        l.as_ref().map(|l| leader_dict(py, l)).transpose()
    }

    /// Waits until the leader changes, at most `timeout` seconds (None: for ever);
    /// returns the new leader (or None when nobody leads), or the current one when the
    /// time ran out.
    #[pyo3(signature = (timeout=None))]
    fn wait_change<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let limit = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let inner = self.inner.clone();
        let seen = block_on(py, async move {
            let mut observer = inner.lock().await;
            let changed = match limit {
                None => observer.changed().await,
                Some(d) => tokio::time::timeout(d, observer.changed()).await.ok().flatten(),
            };
            changed.unwrap_or_else(|| observer.current())
        })?;
        seen.as_ref().map(|l| leader_dict(py, l)).transpose()
    }
}

/// Runs `task(leadership, attempt)` once for `key` across every candidate of the
/// election (see `tenure.run_once`). Returns `("ran", output, token, attempt,
/// recorded)`, `("already_done", holder, token)`, `("failed", exception, token,
/// attempt)` or `("refused", reason)`.
#[pyfunction]
#[pyo3(signature = (store, election, key, task, ttl, attempts, at_most_once, holder=None))]
#[allow(clippy::too_many_arguments)]
fn run_once(
    py: Python<'_>,
    store: &str,
    election: &str,
    key: &str,
    task: Py<PyAny>,
    ttl: f64,
    attempts: u32,
    at_most_once: bool,
    holder: Option<&str>,
) -> PyResult<Py<PyAny>> {
    let ttl = seconds("ttl", ttl)?;
    let key = WorkKey::new(key).map_err(|e| error("invalid", e.to_string()))?;
    let store = open_store(py, store)?;
    let mut builder = Elector::builder(store, election).ttl(ttl);
    if let Some(h) = holder {
        builder = builder.holder(instance(h)?);
    }
    let elector = builder.build().map_err(|e| error("invalid", chain(&e)))?;
    let guarantee = if at_most_once { Guarantee::AtMostOnce } else { Guarantee::AtLeastOnce };
    let policy = Policy { guarantee, attempts: attempts.max(1), ..Policy::default() };
    let task = Arc::new(task);
    let rt = runtime()?;
    let run = {
        let elector = elector.clone();
        async move {
            elector
                .run_once(&key, policy, move |leadership, attempt| {
                    let task = task.clone();
                    async move {
                        // The task runs on a thread of its own, holding the GIL; the term's
                        // end is seen by the task through the leadership it is given.
                        let joined = tokio::task::spawn_blocking(move || {
                            Python::attach(|py| {
                                let l = Py::new(py, Leadership::new(leadership))?;
                                let out = task.call1(py, (l.clone_ref(py), attempt));
                                l.borrow(py).release();
                                out
                            })
                        })
                        .await;
                        match joined {
                            Ok(r) => r.map_err(Failure),
                            Err(e) => Err(Failure(pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))),
                        }
                    }
                })
                .await
        }
    };
    let _entered = rt.enter();
    let once = block_on(py, run)?;
    let once = match once {
        Ok(o) => o,
        Err(e) => return Err(elect_error(e)),
    };
    let out = match once {
        tenure::Once::Ran { output, token, attempt, recorded } => {
            ("ran", output, token.0, attempt, recorded).into_pyobject(py)?.into_any().unbind()
        }
        tenure::Once::AlreadyDone(entry) => {
            ("already_done", entry.holder.to_string(), entry.token.0).into_pyobject(py)?.into_any().unbind()
        }
        tenure::Once::Failed { error, token, attempt } => {
            ("failed", error.0.into_value(py), token.0, attempt).into_pyobject(py)?.into_any().unbind()
        }
        tenure::Once::Refused { why, .. } => ("refused", why.to_string()).into_pyobject(py)?.into_any().unbind(),
        _ => ("refused", "unknown").into_pyobject(py)?.into_any().unbind(),
    };
    Ok(out)
}

/// Asks the gossip group on `broker` to elect one worker to run `action` under `topic`
/// for the election `id`, and waits up to `wait` seconds for the outcome (see
/// `tenure.gossip.elect`). Returns a dict: `id`, `topic`, `winner`, `started`, `error`,
/// `repeat`.
#[pyfunction]
#[pyo3(signature = (broker, group, id, topic, action, wait))]
fn gossip_elect<'py>(
    py: Python<'py>,
    broker: &str,
    group: &str,
    id: &str,
    topic: &str,
    action: &str,
    wait: f64,
) -> PyResult<Bound<'py, PyDict>> {
    use tenure_gossip::GossipError as G;
    let wait = seconds("wait", wait)?;
    let gossip_error = |e: G| {
        let kind = match &e {
            G::BadUrl { .. } | G::Invalid(_) => "invalid",
            G::NoWorkers { .. } | G::NoOutcome { .. } => "timeout",
            G::Broker { .. } => "unavailable",
            _ => "other",
        };
        error(kind, chain(&e))
    };
    let rt = runtime()?;
    let _entered = rt.enter();
    let transport = tenure_gossip::connect(broker, group).map_err(gossip_error)?;
    let (id, topic, action) = (id.to_string(), topic.to_string(), action.to_string());
    let out = block_on(py, async move {
        let client = tenure_gossip::Client::new(transport);
        client.elect(&id, &topic, &action, wait).await
    })?
    .map_err(gossip_error)?;
    let d = PyDict::new(py);
    d.set_item("id", out.id)?;
    d.set_item("topic", out.topic)?;
    d.set_item("winner", out.winner)?;
    d.set_item("started", out.started)?;
    d.set_item("error", out.error)?;
    d.set_item("repeat", out.repeat)?;
    Ok(d)
}

/// A Python exception raised by a task, carried through the Rust runtime.
struct Failure(PyErr);

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The native module.
#[pymodule]
fn _tenure(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Campaign>()?;
    m.add_class::<Leadership>()?;
    m.add_class::<Observer>()?;
    m.add_function(wrap_pyfunction!(run_once, m)?)?;
    m.add_function(wrap_pyfunction!(gossip_elect, m)?)?;
    Ok(())
}
