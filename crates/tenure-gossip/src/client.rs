//! A client: starts elections and lists members without joining the group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;

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
pub struct Client {
    id: String,
    incarnation: u64,
    clock: Arc<AtomicU64>,
    publisher: Arc<dyn Publisher>,
    /// Only the reading task sends, so a lost link closes the channel.
    heard: broadcast::Receiver<Envelope>,
    task: JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Client {
    /// Opens a link to the group.
    pub async fn connect(transport: &dyn Transport) -> Result<Self, GossipError> {
        let mut link = transport.open().await?;
        let (tx, heard) = broadcast::channel(4096);
        let clock = Arc::new(AtomicU64::new(0));
        let c = clock.clone();
        let task = tokio::spawn(async move {
            while let Some(bytes) = link.messages.recv().await {
                if let Some(env) = Envelope::decode(&bytes) {
                    c.fetch_max(env.clock, Ordering::Relaxed);
                    let _ = tx.send(env);
                }
            }
        });
        Ok(Self {
            id: format!("client.{}", default_worker_id()),
            incarnation: fastrand::u64(..),
            clock,
            publisher: link.publisher,
            heard,
            task,
        })
    }

    async fn send(&self, body: Body) -> Result<(), GossipError> {
        let clock = self.clock.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let env = Envelope { v: VERSION, from: self.id.clone(), incarnation: self.incarnation, clock, body };
        self.publisher.publish(env.encode()).await
    }

    /// Asks the group to elect one worker to run `action` under `topic`, and waits up to
    /// `wait` for the outcome: who won, and whether it started the action. An id that was
    /// decided before (and is still remembered) answers with that earlier outcome, marked
    /// [`Outcome::repeat`]; if that election was for another topic or action, the answer
    /// is [`GossipError::IdInUse`] (nothing ran for this request).
    pub async fn elect(&self, id: &str, topic: &str, action: &str, wait: Duration) -> Result<Outcome, GossipError> {
        let request = checked_request(id, topic, action)?;
        let digest = request.digest();
        let mut heard = self.heard.resubscribe();
        self.send(Body::Elect(request)).await?;
        let mut answered = BTreeSet::new();
        let deadline = deadline_after(wait)?;
        loop {
            let env = match tokio::time::timeout_at(deadline, heard.recv()).await {
                Ok(Ok(env)) => env,
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    return Err(GossipError::broker("the broker connection was lost", None));
                }
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
                Body::Candidate { election, .. } | Body::Abstain { election }
                    if election.id == id && election.digest == digest =>
                {
                    answered.insert(env.from);
                }
                _ => {}
            }
        }
    }

    /// Asks every member for a heartbeat and lists those that answer within `wait`.
    pub async fn members(&self, wait: Duration) -> Result<Vec<MemberInfo>, GossipError> {
        let mut heard = self.heard.resubscribe();
        self.send(Body::Probe).await?;
        let mut found = BTreeMap::new();
        let deadline = deadline_after(wait)?;
        loop {
            match tokio::time::timeout_at(deadline, heard.recv()).await {
                Ok(Ok(env)) => {
                    if matches!(env.body, Body::Heartbeat) {
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

fn deadline_after(wait: Duration) -> Result<tokio::time::Instant, GossipError> {
    tokio::time::Instant::now()
        .checked_add(wait)
        .ok_or_else(|| GossipError::Invalid(format!("a wait of {wait:?} is too long")))
}
