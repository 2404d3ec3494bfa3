//! A client: starts elections and lists members without joining the group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, broadcast};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::warn;

use crate::GossipError;
use crate::message::{Body, Envelope, Outcome, VERSION};
use crate::transport::{Publisher, Transport};
use crate::worker::{checked_request, default_worker_id};

/// A member as a probe found it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemberInfo {
    /// The worker id.
    pub id: String,
    /// Its Lamport clock when it answered.
    pub clock: u64,
}

/// Starts elections and asks who is there; never a member, never a candidate.
///
/// A client that loses its broker connection, or cannot reach the broker, makes a new
/// connection (with backoff) for as long as the call under way may wait, and asks again:
/// an election asked during a broker restart is decided once the broker and the workers
/// are back, if the caller's wait outlasts that.
pub struct Client {
    id: String,
    incarnation: u64,
    clock: Arc<AtomicU64>,
    transport: Arc<dyn Transport>,
    conn: Mutex<Option<Arc<Conn>>>,
}

/// One broker connection of a client.
struct Conn {
    publisher: Arc<dyn Publisher>,
    /// Only the reading task sends, so a lost link closes the channel.
    heard: broadcast::Receiver<Envelope>,
    /// A worker has been heard on this connection: a request sent now reaches it.
    worker_heard: Arc<AtomicBool>,
    /// A publish on it failed.
    broken: AtomicBool,
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Conn {
    fn usable(&self) -> bool {
        !self.broken.load(Ordering::Relaxed) && !self.task.is_finished()
    }
}

/// How a wait for messages on one connection ended, when it did not end the call.
enum Interrupted {
    /// The connection was lost: make a new one and ask again.
    LinkLost,
}

impl Client {
    /// A client of the group behind `transport` that connects when first used (so a
    /// broker that is down now is waited for within each call's wait).
    pub fn new(transport: Arc<dyn Transport>) -> Self {
        Self {
            id: format!("client.{}", default_worker_id()),
            incarnation: fastrand::u64(..),
            clock: Arc::new(AtomicU64::new(0)),
            transport,
            conn: Mutex::new(None),
        }
    }

    /// Connects to the group now: fails at once if the broker cannot be reached.
    pub async fn connect(transport: Arc<dyn Transport>) -> Result<Self, GossipError> {
        let client = Self::new(transport);
        let conn = client.open().await?;
        *client.conn.lock().await = Some(conn);
        Ok(client)
    }

    async fn open(&self) -> Result<Arc<Conn>, GossipError> {
        let mut link = self.transport.open().await?;
        let (tx, heard) = broadcast::channel(4096);
        let clock = self.clock.clone();
        let worker_heard = Arc::new(AtomicBool::new(false));
        let seen = worker_heard.clone();
        let task = tokio::spawn(async move {
            while let Some(bytes) = link.messages.recv().await {
                if let Some(env) = Envelope::decode(&bytes) {
                    clock.fetch_max(env.clock, Ordering::Relaxed);
                    if env.body.is_sign_of_life() {
                        seen.store(true, Ordering::Relaxed);
                    }
                    let _ = tx.send(env);
                }
            }
        });
        Ok(Arc::new(Conn { publisher: link.publisher, heard, worker_heard, broken: AtomicBool::new(false), task }))
    }

    /// The current connection, or a new one (retried with backoff until `deadline`).
    async fn link(&self, deadline: Instant) -> Result<Arc<Conn>, GossipError> {
        let mut current = self.conn.lock().await;
        if let Some(c) = current.as_ref().filter(|c| c.usable()) {
            return Ok(c.clone());
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            match tokio::time::timeout_at(deadline, self.open()).await {
                Ok(Ok(c)) => {
                    *current = Some(c.clone());
                    return Ok(c);
                }
                Ok(Err(e)) if Instant::now() < deadline => {
                    warn!(error = %crate::chain(&e), retry_in = ?backoff, "cannot reach the broker; trying again");
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(GossipError::broker(
                        format!("could not connect to {} in time", self.transport.describe()),
                        None,
                    ));
                }
            }
            // Up to the deadline, not short of it: the last try comes at the deadline.
            tokio::time::sleep_until(deadline.min(Instant::now() + backoff)).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    async fn send(&self, conn: &Conn, body: Body) -> Result<(), Interrupted> {
        let clock = self.clock.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let env = Envelope { v: VERSION, from: self.id.clone(), incarnation: self.incarnation, clock, body };
        match conn.publisher.publish(env.encode()).await {
            Ok(()) => Ok(()),
            Err(e) => {
                warn!(error = %crate::chain(&e), "cannot publish; making a new broker connection");
                conn.broken.store(true, Ordering::Relaxed);
                Err(Interrupted::LinkLost)
            }
        }
    }

    /// Waits until a worker has been heard on `conn` (asking with a probe), so that a
    /// request sent next reaches at least one worker: after a broker restart, the client
    /// may be back before any worker is. `Ok(false)` when the deadline passed first.
    async fn await_worker(&self, conn: &Conn, deadline: Instant) -> Result<bool, Interrupted> {
        if conn.worker_heard.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let mut heard = conn.heard.resubscribe();
        self.send(conn, Body::Probe).await?;
        while !conn.worker_heard.load(Ordering::Relaxed) {
            match tokio::time::timeout_at(deadline, heard.recv()).await {
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) => return Err(Interrupted::LinkLost),
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Asks the group to elect one worker to run `action` under `topic`, and waits up to
    /// `wait` for the outcome: who won, and whether it started the action. An id that was
    /// decided before (and is still remembered) answers with that earlier outcome, marked
    /// [`Outcome::repeat`]; if that election was for another topic or action, the answer
    /// is [`GossipError::IdInUse`] (nothing ran for this request).
    ///
    /// The request is sent once a worker has been heard. A broker that cannot be reached,
    /// a publish that fails and a connection lost while waiting are retried within `wait`
    /// with a new connection, and the request is sent again: workers that already heard it
    /// take the second copy for the same election (see `docs/gossip.md`).
    pub async fn elect(&self, id: &str, topic: &str, action: &str, wait: Duration) -> Result<Outcome, GossipError> {
        let request = checked_request(id, topic, action)?;
        let digest = request.digest();
        let deadline = deadline_after(wait)?;
        let mut answered = BTreeSet::new();
        let mut asked = false;
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                // Not at once: a broker that accepts connections and drops them again must
                // not make this a busy loop.
                tokio::time::sleep_until(deadline.min(Instant::now() + Duration::from_millis(100))).await;
            }
            let conn = match self.link(deadline).await {
                Ok(c) => c,
                // Asked already: what came of it is unknown, as when no outcome comes.
                Err(_) if asked && answered.is_empty() => return Err(GossipError::NoWorkers { id: id.into(), wait }),
                Err(_) if asked => {
                    return Err(GossipError::NoOutcome {
                        id: id.into(),
                        answered: answered.into_iter().collect(),
                        wait,
                    });
                }
                Err(e) => return Err(e),
            };
            if asked {
                warn!(election = %id, "the broker connection was lost while waiting; asking again on a new one");
            }
            let mut heard = conn.heard.resubscribe();
            match self.await_worker(&conn, deadline).await {
                Ok(true) => {}
                Ok(false) => return Err(GossipError::NoWorkers { id: id.into(), wait }),
                Err(Interrupted::LinkLost) => continue,
            }
            if self.send(&conn, Body::Elect(request.clone())).await.is_err() {
                continue;
            }
            asked = true;
            loop {
                let env = match tokio::time::timeout_at(deadline, heard.recv()).await {
                    Ok(Ok(env)) => env,
                    Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                    Ok(Err(broadcast::error::RecvError::Closed)) => break,
                    Err(_) if answered.is_empty() => return Err(GossipError::NoWorkers { id: id.into(), wait }),
                    Err(_) => {
                        return Err(GossipError::NoOutcome {
                            id: id.into(),
                            answered: answered.into_iter().collect(),
                            wait,
                        });
                    }
                };
                match env.body {
                    Body::Outcome(o) if o.id == id && o.digest == digest => return Ok(o),
                    Body::Outcome(o) if o.id == id => {
                        return Err(GossipError::IdInUse { id: id.into(), topic: o.topic, winner: o.winner });
                    }
                    Body::Candidate { election, .. } | Body::Abstain { election } | Body::Defer { election }
                        if election.id == id && election.digest == digest =>
                    {
                        answered.insert(env.from);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Asks every member for a heartbeat and lists those that answer within `wait`.
    pub async fn members(&self, wait: Duration) -> Result<Vec<MemberInfo>, GossipError> {
        let deadline = deadline_after(wait)?;
        let conn = self.link(deadline).await?;
        let mut heard = conn.heard.resubscribe();
        if self.send(&conn, Body::Probe).await.is_err() {
            return Err(GossipError::broker("cannot publish on the broker connection", None));
        }
        let mut found = BTreeMap::new();
        loop {
            match tokio::time::timeout_at(deadline, heard.recv()).await {
                Ok(Ok(env)) => {
                    if matches!(env.body, Body::Heartbeat { .. }) {
                        found.insert(env.from, env.clock);
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(GossipError::broker("the broker connection was lost", None));
                }
                Err(_) => break,
            }
        }
        Ok(found.into_iter().map(|(id, clock)| MemberInfo { id, clock }).collect())
    }
}

fn deadline_after(wait: Duration) -> Result<Instant, GossipError> {
    Instant::now().checked_add(wait).ok_or_else(|| GossipError::Invalid(format!("a wait of {wait:?} is too long")))
}
