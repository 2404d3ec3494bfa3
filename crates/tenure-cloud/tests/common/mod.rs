//! What the emulator tests share: a throwaway emulator behind a TCP proxy (so a test can
//! cut every client connection), and the harness of the conformance suite and the
//! scenario over it.

#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure::store::{Acquire, AcquireRequest};
use tenure::{ElectionName, HolderId, LeaseStore};
use tenure_testkit::conformance::Harness;
use tenure_testkit::proxy::{Mode, Proxy};
use tenure_testkit::servers::{self, Kind, Server};

/// Opens a store on the emulator whose endpoint (through the proxy) is the first
/// argument, in the bucket, table or container named by the second.
pub type Opener = fn(String, &'static str) -> Pin<Box<dyn Future<Output = Arc<dyn LeaseStore>> + Send>>;

/// An emulator, reached through a proxy.
pub struct Emulator {
    server: Mutex<Server>,
    proxy: Proxy,
    open: Opener,
    /// Whether a restart keeps the data (moto keeps everything in memory).
    durable: bool,
    short_ttl: Duration,
}

impl Emulator {
    /// Starts `kind`, or says why not and answers `None` (see `servers::launch`).
    pub fn launch(kind: Kind, open: Opener) -> Option<Self> {
        let server = servers::launch(kind)?;
        let proxy = Proxy::start(("127.0.0.1", server.port())).unwrap();
        let durable = kind != Kind::Moto;
        Some(Self { server: Mutex::new(server), proxy, open, durable, short_ttl: Duration::from_secs(1) })
    }

    /// Sets the TTL of the conformance suite's expiry cases.
    pub fn short_ttl(mut self, ttl: Duration) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// The emulator's address through the proxy, as its URL shows it.
    pub fn endpoint(&self) -> String {
        let server = self.server.lock().unwrap();
        server.url().replacen(&format!(":{}", server.port()), &format!(":{}", self.proxy.port()), 1)
    }

    /// A new store handle on `bucket`.
    pub async fn open(&self, bucket: &'static str) -> Arc<dyn LeaseStore> {
        (self.open)(self.endpoint(), bucket).await
    }
}

#[async_trait::async_trait]
impl Harness for Emulator {
    async fn open(&self) -> Arc<dyn LeaseStore> {
        Emulator::open(self, "conformance").await
    }
    async fn restart(&self) -> bool {
        if self.durable {
            self.server.lock().unwrap().restart();
        }
        self.durable
    }
    async fn kill_connections(&self) -> bool {
        self.proxy.set(Mode::Cut);
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.proxy.set(Mode::Pass);
        true
    }
    fn short_ttl(&self) -> Duration {
        self.short_ttl
    }
}

/// A whole HTTP response with `status` (e.g. "503 Slow Down") and `body`, that closes the
/// connection after it.
pub fn http_reply(status: &str, content_type: &str, body: &str) -> &'static [u8] {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    Box::leak(text.into_bytes().into_boxed_slice())
}

impl Emulator {
    /// Makes the service answer every request with each of `replies` in turn (what a
    /// throttling or failing service sends: 429, 503, 500, DynamoDB's 400 throttling),
    /// and checks that a store on it reports each as an error that a retry can mend,
    /// naming `expect` (the status or the service's code); then that the store, after
    /// the service serves again, takes a lease as if nothing had happened.
    pub async fn refusals_are_retried(&self, bucket: &'static str, replies: &[(&'static [u8], &str)]) {
        let store = self.open(bucket).await;
        let req = |name: &str| {
            AcquireRequest::new(ElectionName::new(name).unwrap(), HolderId::new("p").unwrap(), self.short_ttl)
        };
        assert!(matches!(store.try_acquire(&req("before")).await.unwrap(), tenure::store::Acquire::Acquired(_)));
        for &(reply, expect) in replies {
            self.proxy.set(Mode::Answer(reply));
            // Let the proxy close the pooled connections first (it looks every 20 ms), so
            // that every request meets the answer rather than a closing connection.
            tokio::time::sleep(Duration::from_millis(100)).await;
            for (op, result) in [
                ("acquire", store.try_acquire(&req("during")).await.map(|_| ())),
                ("get", store.get(&ElectionName::new("before").unwrap()).await.map(|_| ())),
            ] {
                let err = result.expect_err(&format!("{op} went through while the service refused everything"));
                assert!(err.is_retryable(), "{op}: {expect} must be retried, not end the campaign: {err}");
                assert!(err.to_string().contains(expect), "{op}: the error does not name {expect}: {err}");
            }
        }
        self.proxy.set(Mode::Pass);
        let t0 = std::time::Instant::now();
        loop {
            match store.try_acquire(&req("during")).await {
                Ok(tenure::store::Acquire::Acquired(_)) => break,
                Ok(other) => panic!("nobody else campaigns, yet: {other:?}"),
                Err(e) => {
                    assert!(e.is_retryable(), "{e}");
                    assert!(
                        t0.elapsed() < Duration::from_secs(20),
                        "still refused after the service served again: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

impl Emulator {
    /// Starves the emulator of CPU ([`servers::starve`]) and then, `rounds` times, has
    /// sixteen handles (as of sixteen processes) campaign at once for a vacant election: each
    /// time exactly one is granted it, with a token above every one before, the others
    /// are told that one holds it, and the winner lets go for the next round. A service
    /// whose conditional writes are not atomic grants some vacancy twice.
    pub async fn one_grant_per_vacancy_on_a_starved_server(&self, bucket: &'static str, rounds: usize) {
        let e = ElectionName::new("jobs/contended").unwrap();
        let mut handles = Vec::new();
        for _ in 0..16 {
            handles.push(self.open(bucket).await);
        }
        let pid = self.server.lock().unwrap().pid().expect("the emulator runs");
        let _starved = servers::starve(pid).expect("the emulator can be pinned to one CPU");
        let mut last = 0;
        for round in 0..rounds {
            let mut tries = tokio::task::JoinSet::new();
            for (i, h) in handles.iter().enumerate() {
                let (h, e, ttl) = (h.clone(), e.clone(), self.short_ttl);
                tries.spawn(async move {
                    let req = AcquireRequest::new(e, HolderId::new(format!("c{i}")).unwrap(), ttl);
                    // An error is asked again, as the runtime does: a grant whose answer
                    // was lost then comes back as the campaigner's own.
                    let mut answer = h.try_acquire(&req).await;
                    for _ in 0..5 {
                        match &answer {
                            Err(err) if err.is_retryable() => answer = h.try_acquire(&req).await,
                            _ => break,
                        }
                    }
                    (i, answer)
                });
            }
            let mut granted = Vec::new();
            let mut told = Vec::new();
            while let Some(joined) = tries.join_next().await {
                match joined.unwrap() {
                    (i, Ok(Acquire::Acquired(rec))) => granted.push((i, rec)),
                    (_, Ok(Acquire::Held(rec))) => told.push(rec),
                    (i, Err(err)) => {
                        panic!("round {round}: c{i} got no answer from the starved emulator in six tries: {err}")
                    }
                }
            }
            let [(winner, rec)] = granted.as_slice() else {
                let who: Vec<String> = granted.iter().map(|(i, r)| format!("c{i} (token {})", r.token.0)).collect();
                panic!("round {round}: the vacancy was granted to {} campaigners at once: {who:?}", who.len());
            };
            assert!(rec.token.0 > last, "round {round}: token {} after token {last}", rec.token.0);
            for other in &told {
                assert_eq!(
                    (&other.holder, other.token),
                    (&rec.holder, rec.token),
                    "round {round}: told of another holder"
                );
            }
            last = rec.token.0;
            let mut released = handles[*winner].release(rec).await;
            for _ in 0..5 {
                match &released {
                    Err(err) if err.is_retryable() => released = handles[*winner].release(rec).await,
                    _ => break,
                }
            }
            released.unwrap_or_else(|err| panic!("round {round}: the release went unanswered in six tries: {err}"));
        }
    }
}
