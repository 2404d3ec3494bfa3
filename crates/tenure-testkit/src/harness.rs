//! How the conformance suite and the multi-candidate scenario reach a store under test:
//! one [`Harness`] trait for both, and [`Served`], the harness of a store on one
//! throwaway server, so that a store's tests say only how to open it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tenure::LeaseStore;

use crate::proxy::{Mode, Proxy};
use crate::servers::{self, Kind, Server};

/// The TTL of leases the conformance cases expect to outlast the case, unless the harness
/// says otherwise.
pub const LONG_TTL: Duration = Duration::from_secs(30);

/// How the conformance suite ([`crate::conformance::run_all`]) and the multi-candidate
/// scenario ([`crate::scenario::multi_candidate`]) reach the store under test.
#[async_trait::async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A handle on the store under test: a fresh connection where the store has
    /// connections, so that racing handles are really separate clients.
    async fn open(&self) -> Arc<dyn LeaseStore>;

    /// Restarts (or closes and reopens) the store, keeping what it keeps durably.
    /// Return false if the store cannot be restarted; the cases and steps that restart
    /// it are then skipped.
    async fn restart(&self) -> bool {
        false
    }

    /// Cuts every client connection to the store, as a server restart or a network
    /// fault would, and lets clients connect again. Return false if the harness cannot;
    /// the scenario then skips that step.
    async fn kill_connections(&self) -> bool {
        false
    }

    /// Whether a [`Harness::restart`] keeps what the store wrote (its data is on disk):
    /// then a work-ledger entry must survive it. A store restarted without its data (a
    /// Redis that keeps nothing on disk) still owes growing tokens, not the ledger.
    fn durable(&self) -> bool {
        true
    }

    /// The TTL the expiry cases use; they wait about twice this long. A case checks that
    /// such a lease is still held a few calls after it was granted, so the TTL must outlast
    /// those calls even on a busy machine (the cases run at once): 1 s by default.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// The TTL of leases a case expects to outlast it ([`LONG_TTL`]). A store that serves
    /// one TTL only (a NATS bucket) answers the same as [`Harness::short_ttl`].
    fn long_ttl(&self) -> Duration {
        LONG_TTL
    }
}

/// Opens a store handle from the URL its clients use.
pub type Opener = fn(String) -> Pin<Box<dyn Future<Output = Arc<dyn LeaseStore>> + Send>>;

/// Cuts every client connection by the server's own means (PostgreSQL's
/// `pg_terminate_backend`, Redis's `CLIENT KILL`), given the server's own URL.
pub type Killer = fn(String) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// The harness of a store on one throwaway server ([`servers::launch`]): the server,
/// either behind a [`Proxy`] (connections are cut there) or reached directly (they are
/// cut by a [`Killer`]), and how to open a store on it.
///
/// ```no_run
/// use std::sync::Arc;
/// use tenure_testkit::harness::Served;
/// use tenure_testkit::servers::Kind;
///
/// # async fn t() {
/// let Some(h) = Served::behind_proxy(Kind::Redis, |url| {
///     Box::pin(async move { Arc::new(tenure::MemoryStore::new()) as _ }) // your store on `url`
/// }) else {
///     return; // the server's binary is missing: the test says so and is skipped
/// };
/// tenure_testkit::conformance::run_all(h).await;
/// # }
/// ```
pub struct Served {
    server: Mutex<Server>,
    proxy: Option<Proxy>,
    open: Opener,
    kill: Option<Killer>,
    durable: bool,
    short_ttl: Duration,
    long_ttl: Duration,
}

impl Served {
    /// Starts a server of `kind` behind a proxy, so that clients connect through the
    /// proxy and [`Harness::kill_connections`] cuts them there; `open` gets the server's
    /// URL with the proxy's port. `None` (having said why) if the server's binary is
    /// missing, as [`servers::launch`] says.
    pub fn behind_proxy(kind: Kind, open: Opener) -> Option<Self> {
        let server = servers::launch(kind)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).expect("a proxy on a free port");
        Some(Self::new(server, Some(proxy), open, None))
    }

    /// Starts a server of `kind` that clients reach directly; `kill` cuts their
    /// connections by the server's own means.
    pub fn direct(kind: Kind, open: Opener, kill: Killer) -> Option<Self> {
        let server = servers::launch(kind)?;
        Some(Self::new(server, None, open, Some(kill)))
    }

    fn new(server: Server, proxy: Option<Proxy>, open: Opener, kill: Option<Killer>) -> Self {
        let base = Duration::from_secs(1);
        Self { server: Mutex::new(server), proxy, open, kill, durable: true, short_ttl: base, long_ttl: LONG_TTL }
    }

    /// A server whose restart loses what it wrote ([`Harness::durable`]).
    pub fn not_durable(mut self) -> Self {
        self.durable = false;
        self
    }

    /// Sets [`Harness::short_ttl`].
    pub fn short_ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// Sets [`Harness::long_ttl`].
    pub fn long_ttl(mut self, ttl: Duration) -> Self {
        self.long_ttl = ttl;
        self
    }

    /// The URL clients use: through the proxy, where there is one.
    pub fn url(&self) -> String {
        let server = self.server();
        match &self.proxy {
            Some(p) => server.url().replacen(&format!(":{}", server.port()), &format!(":{}", p.port()), 1),
            None => server.url(),
        }
    }

    /// The server's own URL, past the proxy.
    pub fn direct_url(&self) -> String {
        self.server().url()
    }

    /// The server, to restart it, stop it or read its port.
    pub fn server(&self) -> MutexGuard<'_, Server> {
        self.server.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The proxy clients connect through, if there is one.
    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }
}

#[async_trait::async_trait]
impl Harness for Served {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        (self.open)(self.url()).await
    }

    async fn restart(&self) -> bool {
        self.server().restart();
        true
    }

    async fn kill_connections(&self) -> bool {
        if let Some(p) = &self.proxy {
            p.set(Mode::Cut);
            tokio::time::sleep(Duration::from_millis(100)).await;
            p.set(Mode::Pass);
            return true;
        }
        match self.kill {
            Some(kill) => {
                kill(self.direct_url()).await;
                true
            }
            None => false,
        }
    }

    fn durable(&self) -> bool {
        self.durable
    }

    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }

    fn long_ttl(&self) -> Duration {
        self.long_ttl
    }
}
