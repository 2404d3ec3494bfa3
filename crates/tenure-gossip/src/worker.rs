//! The worker: membership, elections, and running the won ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::handler::{Claim, Handlers, Job};
use crate::message::{Body, Envelope, Outcome, Request, VERSION};
use crate::rule::{self, Bid};
use crate::transport::{Link, Publisher, Transport};
use crate::{GossipError, check_topic};

/// How many decided election ids a worker remembers at most (besides [`Config::retention`]).
const MAX_REMEMBERED: usize = 100_000;
/// The longest worker id (a holder id is at most 200 characters; a claim adds an attempt).
const MAX_ID: usize = 150;
/// The longest time setting.
const MAX_SETTING: Duration = Duration::from_secs(24 * 3600);

/// A worker's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// This worker's id; [`default_worker_id`] (`hostname.pid`) by default. Two live
    /// workers must not share one.
    pub id: String,
    /// How often the worker says it is alive (2 s).
    pub heartbeat: Duration,
    /// How long a member may be silent before it counts as lost (5 s: two missed
    /// heartbeats and half an interval of slack).
    pub lost_after: Duration,
    /// How long a joining worker collects the members' clocks before it stands in
    /// elections (500 ms).
    pub join_wait: Duration,
    /// How long an election waits for every member it started with; after that it waits
    /// only for members still live (2 s).
    pub election_timeout: Duration,
    /// How long a decided election id is remembered, so that a repeated or late message
    /// about it changes nothing (10 min).
    pub retention: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            id: default_worker_id(),
            heartbeat: Duration::from_secs(2),
            lost_after: Duration::from_secs(5),
            join_wait: Duration::from_millis(500),
            election_timeout: Duration::from_secs(2),
            retention: Duration::from_secs(600),
        }
    }
}

impl Config {
    /// When an undecided election is given up: by then every member that was silent from
    /// its start has been lost, so whoever is still awaited is live but did not answer
    /// (its messages were lost).
    pub fn give_up_after(&self) -> Duration {
        self.election_timeout + self.lost_after + self.heartbeat
    }

    fn check(&self) -> Result<(), GossipError> {
        let bad = |m: String| Err(GossipError::Invalid(m));
        // The id names the worker's store claims too, so it follows the holder-id rule, with
        // room left for the claim attempt.
        if let Err(e) = tenure::HolderId::new(&self.id) {
            return bad(format!("invalid worker id: {e}"));
        }
        if self.id.len() > MAX_ID {
            return bad(format!("invalid worker id {:?}: at most {MAX_ID} characters", self.id));
        }
        for (what, d) in [
            ("heartbeat", self.heartbeat),
            ("lost-after", self.lost_after),
            ("join wait", self.join_wait),
            ("election timeout", self.election_timeout),
            ("retention", self.retention),
        ] {
            if d.is_zero() || d > MAX_SETTING {
                return bad(format!("{what} {d:?} must be more than zero and at most {MAX_SETTING:?}"));
            }
        }
        if self.lost_after <= self.heartbeat {
            return bad(format!(
                "lost-after ({:?}) must be longer than the heartbeat interval ({:?})",
                self.lost_after, self.heartbeat
            ));
        }
        Ok(())
    }
}

/// `hostname.pid` (the host name as [`tenure::host_name`] gives it).
pub fn default_worker_id() -> String {
    format!("{}.{}", tenure::host_name(), std::process::id())
}

/// What one worker decided in one election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The election id.
    pub election: String,
    /// The election's topic.
    pub topic: String,
    /// The winner, if any candidate could run the topic.
    pub winner: Option<String>,
    /// Every candidate that could run the topic, with its bid.
    pub bids: Vec<Bid>,
    /// Decided after the election timeout, without some member it started with.
    pub without: Vec<String>,
}

/// Something a worker saw or did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// This worker has joined (again, after a reconnect); the members it found.
    Joined {
        /// The other live members.
        members: Vec<String>,
    },
    /// A worker joined the group (or was heard from again after being lost).
    MemberJoined(String),
    /// A worker left the group.
    MemberLeft(String),
    /// A worker was silent for longer than [`Config::lost_after`].
    MemberLost(String),
    /// This worker decided an election.
    Decided(Decision),
    /// This worker gave an election up: members still live never answered.
    Abandoned {
        /// The election id.
        election: String,
        /// The members that did not answer.
        waiting: Vec<String>,
    },
    /// This worker won and started the action.
    Started {
        /// The election id.
        election: String,
    },
    /// This worker won but did not start the action.
    NotStarted {
        /// The election id.
        election: String,
        /// Why.
        error: String,
    },
    /// Another worker reported a different winner than the one this worker decided.
    Disagreement {
        /// The election id.
        election: String,
        /// This worker's winner.
        ours: Option<String>,
        /// The winner in the other worker's outcome.
        theirs: Option<String>,
        /// Who sent that outcome.
        from: String,
    },
    /// The broker connection was lost; the worker reconnects and joins again.
    LinkLost,
}

enum Command {
    Elect(Request, oneshot::Sender<Result<(), GossipError>>),
    Members(oneshot::Sender<Vec<String>>),
    Shutdown(oneshot::Sender<()>),
}

/// A running worker. Dropping it stops the worker without leaving; call
/// [`Worker::shutdown`] to leave cleanly.
pub struct Worker {
    id: String,
    commands: mpsc::Sender<Command>,
    /// Only the actor sends events, so receivers see the channel close when it stops.
    events: broadcast::Receiver<Event>,
    first_events: Option<broadcast::Receiver<Event>>,
    task: JoinHandle<Result<(), GossipError>>,
}

impl Worker {
    /// Connects, joins the group (waiting [`Config::join_wait`] for the members' clocks)
    /// and returns the running worker. Fails if the broker cannot be reached.
    pub async fn start(
        transport: Arc<dyn Transport>,
        config: Config,
        handlers: Handlers,
        claim: Option<Claim>,
    ) -> Result<Worker, GossipError> {
        config.check()?;
        let link = transport.open().await?;
        let (events, first_events) = broadcast::channel(4096);
        let (commands, rx) = mpsc::channel(64);
        let (ran_tx, ran_rx) = mpsc::channel(256);
        let (joined_tx, joined_rx) = oneshot::channel();
        let now = Instant::now();
        let actor = Actor {
            incarnation: fastrand::u64(..),
            clock: 0,
            transport,
            publisher: link.publisher.clone(),
            handlers,
            claim,
            events,
            members: BTreeMap::new(),
            left: HashMap::new(),
            joined: false,
            join_done: now,
            joined_tx: Some(joined_tx),
            draining: false,
            elections: BTreeMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            next_heartbeat: now,
            ran_tx,
            pending_runs: 0,
            attempts: 0,
            running: Vec::new(),
            abstained: HashSet::new(),
            cfg: config.clone(),
        };
        let task = tokio::spawn(actor.run(link, rx, ran_rx));
        let events = first_events.resubscribe();
        let mut worker = Worker { id: config.id, commands, events, first_events: Some(first_events), task };
        if joined_rx.await.is_err() {
            return Err(worker.stopped().await);
        }
        Ok(worker)
    }

    async fn stopped(&mut self) -> GossipError {
        match (&mut self.task).await {
            Ok(Err(e)) => e,
            _ => GossipError::Stopped,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The worker's events; the first call also gets those since it started.
    pub fn events(&mut self) -> broadcast::Receiver<Event> {
        self.first_events.take().unwrap_or_else(|| self.events.resubscribe())
    }

    /// Starts an election from this worker: broadcasts it and stands in it. Returns once
    /// it is sent; the decision comes as an [`Event::Decided`].
    pub async fn elect(&self, id: &str, topic: &str, action: &str) -> Result<(), GossipError> {
        let request = checked_request(id, topic, action)?;
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Elect(request, tx)).await.map_err(|_| GossipError::Stopped)?;
        rx.await.map_err(|_| GossipError::Stopped)?
    }

    /// The live members this worker knows, itself included, by id.
    pub async fn members(&self) -> Result<Vec<String>, GossipError> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Members(tx)).await.map_err(|_| GossipError::Stopped)?;
        rx.await.map_err(|_| GossipError::Stopped)
    }

    /// Leaves the group cleanly: stops standing in new elections, waits for those under way
    /// to be decided (at most [`Config::give_up_after`]) and for the actions this worker
    /// started to finish, then says goodbye.
    pub async fn shutdown(mut self) -> Result<(), GossipError> {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).await.is_err() || rx.await.is_err() {
            return Err(self.stopped().await);
        }
        match (&mut self.task).await {
            Ok(r) => r,
            Err(_) => Err(GossipError::Stopped),
        }
    }

    /// Waits until the worker stops by itself (it only does so on a fatal error).
    pub async fn wait(mut self) -> Result<(), GossipError> {
        match (&mut self.task).await {
            Ok(r) => r,
            Err(_) => Err(GossipError::Stopped),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) fn checked_request(id: &str, topic: &str, action: &str) -> Result<Request, GossipError> {
    tenure::ElectionName::new(id).map_err(|e| GossipError::Invalid(format!("invalid election id: {e}")))?;
    check_topic(topic)?;
    if action.len() > 64 * 1024 {
        return Err(GossipError::Invalid(format!("the action is {} bytes; at most 65536", action.len())));
    }
    Ok(Request { id: id.into(), topic: topic.into(), action: action.into() })
}

struct Member {
    last_seen: Instant,
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Candidate { clock: u64, handles: bool },
    Abstain,
}

struct Election {
    request: Request,
    /// The live set when this worker first heard of the election, itself included.
    members: BTreeSet<String>,
    answers: BTreeMap<String, Answer>,
    /// An outcome another worker reported before this one decided: checked at the decision.
    reported: Option<(String, Outcome)>,
    deadline: Instant,
    give_up: Instant,
}

struct Finished {
    winner: Option<String>,
    /// The outcome this worker published (as winner or reporter), to repeat on request.
    outcome: Option<Outcome>,
}

struct Ran {
    election: String,
    result: Result<Option<JoinHandle<()>>, String>,
}

struct Actor {
    cfg: Config,
    incarnation: u64,
    clock: u64,
    transport: Arc<dyn Transport>,
    publisher: Arc<dyn Publisher>,
    handlers: Handlers,
    claim: Option<Claim>,
    events: broadcast::Sender<Event>,
    /// The other live members.
    members: BTreeMap<String, Member>,
    /// Members that said goodbye, and when.
    left: HashMap<String, Instant>,
    joined: bool,
    join_done: Instant,
    joined_tx: Option<oneshot::Sender<()>>,
    draining: bool,
    elections: BTreeMap<String, Election>,
    finished: HashMap<String, Finished>,
    finished_order: VecDeque<(Instant, String)>,
    next_heartbeat: Instant,
    ran_tx: mpsc::Sender<Ran>,
    pending_runs: usize,
    attempts: u64,
    running: Vec<JoinHandle<()>>,
    /// Elections answered with an abstention while leaving (not tracked further).
    abstained: HashSet<String>,
}

impl Actor {
    async fn run(
        mut self,
        mut link: Link,
        mut commands: mpsc::Receiver<Command>,
        mut ran: mpsc::Receiver<Ran>,
    ) -> Result<(), GossipError> {
        self.begin_join().await;
        let mut shutdown: Option<oneshot::Sender<()>> = None;
        loop {
            let wake = self.next_wake();
            tokio::select! {
                m = link.messages.recv() => match m {
                    Some(bytes) => self.on_bytes(&bytes).await,
                    None => {
                        warn!(broker = %self.transport.describe(), "lost the broker connection; reconnecting");
                        self.emit(Event::LinkLost);
                        match self.reconnect(&mut commands, &mut shutdown).await {
                            Some(l) => {
                                link = l;
                                self.begin_join().await;
                            }
                            None => {
                                // Leaving without a broker: nothing more can be decided.
                                if let Some(reply) = shutdown {
                                    let _ = reply.send(());
                                }
                                return Ok(());
                            }
                        }
                    }
                },
                Some(c) = commands.recv() => match c {
                    Command::Elect(request, done) => {
                        self.send(Body::Elect(request.clone())).await;
                        self.on_request(request, None).await;
                        let _ = done.send(Ok(()));
                    }
                    Command::Members(reply) => {
                        let _ = reply.send(self.member_ids());
                    }
                    Command::Shutdown(reply) => {
                        info!(worker = %self.cfg.id, elections = self.elections.len(), "leaving: finishing elections under way");
                        self.draining = true;
                        shutdown = Some(reply);
                    }
                },
                Some(r) = ran.recv() => self.on_ran(r).await,
                _ = tokio::time::sleep_until(wake) => {}
            }
            self.tick().await;
            if self.draining && self.elections.is_empty() && self.pending_runs == 0 {
                self.send(Body::Leave).await;
                let running: Vec<_> =
                    std::mem::take(&mut self.running).into_iter().filter(|t| !t.is_finished()).collect();
                if !running.is_empty() {
                    info!(actions = running.len(), "waiting for the actions this worker started");
                }
                for t in running {
                    let _ = t.await;
                }
                info!(worker = %self.cfg.id, "left the group");
                if let Some(reply) = shutdown {
                    let _ = reply.send(());
                }
                return Ok(());
            }
        }
    }

    /// Reconnects with backoff; `None` when the worker is leaving (asked before or during).
    async fn reconnect(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        shutdown: &mut Option<oneshot::Sender<()>>,
    ) -> Option<Link> {
        let mut backoff = Duration::from_millis(100);
        loop {
            if self.draining {
                return None;
            }
            match self.transport.open().await {
                Ok(link) => {
                    info!(broker = %self.transport.describe(), "reconnected");
                    self.publisher = link.publisher.clone();
                    return Some(link);
                }
                Err(e) => warn!(error = %crate::chain(&e), retry_in = ?backoff, "cannot reconnect"),
            }
            let until = tokio::time::Instant::now() + backoff;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    Some(c) = commands.recv() => match c {
                        Command::Elect(_, done) => {
                            let _ = done.send(Err(GossipError::broker(
                                format!("not connected to {}; reconnecting, try again", self.transport.describe()),
                                None,
                            )));
                        }
                        Command::Members(reply) => {
                            let _ = reply.send(self.member_ids());
                        }
                        Command::Shutdown(reply) => {
                            self.draining = true;
                            *shutdown = Some(reply);
                            return None;
                        }
                    },
                }
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// The live members this worker knows, itself included, by id.
    fn member_ids(&self) -> Vec<String> {
        let mut all: Vec<String> = self.members.keys().cloned().collect();
        all.push(self.cfg.id.clone());
        all.sort();
        all
    }

    fn emit(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// Publishes `body` stamped with the next clock value; returns that value.
    async fn send(&mut self, body: Body) -> u64 {
        self.clock = self.clock.saturating_add(1);
        let env =
            Envelope { v: VERSION, from: self.cfg.id.clone(), incarnation: self.incarnation, clock: self.clock, body };
        if let Err(e) = self.publisher.publish(env.encode()).await {
            warn!(error = %crate::chain(&e), "cannot publish");
        }
        env.clock
    }

    async fn begin_join(&mut self) {
        let now = Instant::now();
        self.joined = false;
        self.join_done = now + self.cfg.join_wait;
        self.next_heartbeat = now + self.cfg.heartbeat;
        self.send(Body::Hello).await;
    }

    async fn on_bytes(&mut self, bytes: &[u8]) {
        let Some(env) = Envelope::decode(bytes) else {
            debug!(len = bytes.len(), "ignoring a message that is not ours");
            return;
        };
        if env.from == self.cfg.id {
            if env.incarnation != self.incarnation {
                tracing::error!(id = %env.from, "another process uses this worker id; give each worker its own id");
            }
            return;
        }
        self.clock = self.clock.max(env.clock).saturating_add(1);
        let from = env.from.clone();
        // Only members send these; elections and probes may come from clients.
        if matches!(
            env.body,
            Body::Hello | Body::Heartbeat | Body::Candidate { .. } | Body::Abstain { .. } | Body::Outcome(_)
        ) {
            self.saw_worker(&from);
        }
        match env.body {
            Body::Hello | Body::Probe => {
                self.send(Body::Heartbeat).await;
            }
            Body::Heartbeat => {}
            Body::Leave => {
                if self.members.remove(&from).is_some() {
                    info!(member = %from, "member left");
                    self.emit(Event::MemberLeft(from.clone()));
                }
                self.left.insert(from, Instant::now());
            }
            Body::Elect(request) => self.on_request(request, None).await,
            Body::Candidate { request, handles } => {
                self.on_request(request, Some((from, Answer::Candidate { clock: env.clock, handles }))).await;
            }
            Body::Abstain { request } => self.on_request(request, Some((from, Answer::Abstain))).await,
            Body::Outcome(outcome) => self.on_outcome(&from, outcome),
        }
    }

    fn saw_worker(&mut self, from: &str) {
        let now = Instant::now();
        self.left.remove(from);
        match self.members.get_mut(from) {
            Some(m) => m.last_seen = now,
            None => {
                self.members.insert(from.to_string(), Member { last_seen: now });
                if self.joined {
                    info!(member = %from, "member joined");
                    self.emit(Event::MemberJoined(from.to_string()));
                }
            }
        }
    }

    async fn on_request(&mut self, request: Request, answer: Option<(String, Answer)>) {
        let id = request.id.clone();
        if let Some(f) = self.finished.get(&id) {
            // A repeated request for a decided id: whoever published its outcome repeats it.
            if answer.is_none()
                && let Some(outcome) = &f.outcome
            {
                let repeat = Outcome { repeat: true, ..outcome.clone() };
                self.send(Body::Outcome(repeat)).await;
            }
            return;
        }
        if checked_request(&request.id, &request.topic, &request.action).is_err() {
            warn!(election = %request.id, "ignoring an election with an invalid id, topic or action");
            return;
        }
        if self.draining && !self.elections.contains_key(&id) {
            // Leaving: answer once so nobody waits for us, and follow it no further.
            if self.abstained.insert(id) {
                self.send(Body::Abstain { request }).await;
            }
            return;
        }
        if !self.elections.contains_key(&id) {
            let now = Instant::now();
            let mut members: BTreeSet<String> = self.members.keys().cloned().collect();
            members.insert(self.cfg.id.clone());
            let stand = self.joined && !self.draining;
            let own = if stand {
                let handles = self.handlers.get(&request.topic).is_some();
                let clock = self.send(Body::Candidate { request: request.clone(), handles }).await;
                Answer::Candidate { clock, handles }
            } else {
                self.send(Body::Abstain { request: request.clone() }).await;
                Answer::Abstain
            };
            debug!(election = %id, members = members.len(), ?own, "election started");
            let mut answers = BTreeMap::new();
            answers.insert(self.cfg.id.clone(), own);
            let election = Election {
                request,
                members,
                answers,
                reported: None,
                deadline: now + self.cfg.election_timeout,
                give_up: now + self.cfg.give_up_after(),
            };
            self.elections.insert(id.clone(), election);
        }
        if let Some((from, a)) = answer
            && let Some(e) = self.elections.get_mut(&id)
        {
            e.answers.entry(from).or_insert(a);
        }
        self.check(&id).await;
    }

    fn is_live(&self, worker: &str) -> bool {
        worker == self.cfg.id || self.members.contains_key(worker)
    }

    /// Decides `id` if every awaited member has answered, or gives it up when too late.
    async fn check(&mut self, id: &str) {
        let Some(e) = self.elections.get(id) else { return };
        let now = Instant::now();
        let late = now >= e.deadline;
        let waiting: Vec<String> = e
            .members
            .iter()
            .filter(|w| !e.answers.contains_key(*w) && !self.left.contains_key(*w) && (!late || self.is_live(w)))
            .cloned()
            .collect();
        if waiting.is_empty() {
            let without: Vec<String> = e.members.iter().filter(|w| !e.answers.contains_key(*w)).cloned().collect();
            self.decide(id, without).await;
        } else if now >= e.give_up {
            let e = self.elections.remove(id).expect("present");
            warn!(election = %id, ?waiting, "gave the election up: live members never answered");
            self.remember(id, Finished { winner: None, outcome: None });
            self.emit(Event::Abandoned { election: e.request.id, waiting });
        }
    }

    async fn decide(&mut self, id: &str, without: Vec<String>) {
        let e = self.elections.remove(id).expect("present");
        let mut bids = Vec::new();
        let mut all = Vec::new();
        // Only the answers of the members this worker started with: an answer from outside
        // that set may reach some workers before they decide and others after.
        for (worker, a) in e.answers.iter().filter(|(w, _)| e.members.contains(*w)) {
            if let Answer::Candidate { clock, handles } = *a {
                let bid = Bid { clock, worker: worker.clone() };
                if handles {
                    bids.push(bid.clone());
                }
                all.push(bid);
            }
        }
        bids.sort();
        let winner = rule::winner(&bids).map(|b| b.worker.clone());
        // Who tells the initiator when nobody can run it: the first by the same rule.
        let reporter = winner
            .clone()
            .or_else(|| rule::winner(&all).map(|b| b.worker.clone()))
            .or_else(|| e.answers.keys().find(|w| e.members.contains(*w)).cloned());
        let request = e.request;
        info!(
            election = %request.id,
            topic = %request.topic,
            winner = winner.as_deref().unwrap_or("-"),
            candidates = bids.len(),
            ?without,
            "decided"
        );
        self.emit(Event::Decided(Decision {
            election: request.id.clone(),
            topic: request.topic.clone(),
            winner: winner.clone(),
            bids,
            without,
        }));
        if let Some((from, outcome)) = &e.reported
            && outcome.winner != winner
        {
            self.disagree(from, outcome.clone(), winner.clone());
        }
        let mine = reporter.as_deref() == Some(self.cfg.id.as_str());
        self.remember(id, Finished { winner: winner.clone(), outcome: None });
        if winner.as_deref() == Some(self.cfg.id.as_str()) {
            self.start_action(request);
        } else if winner.is_none() && mine {
            let error = if all.is_empty() {
                "no worker stood: every live worker was joining or leaving".to_string()
            } else {
                format!("no live worker has a handler for topic {:?}", request.topic)
            };
            let outcome =
                Outcome { id: request.id.clone(), winner: None, started: false, error: Some(error), repeat: false };
            self.publish_outcome(outcome).await;
        }
    }

    fn start_action(&mut self, request: Request) {
        let Some(handler) = self.handlers.get(&request.topic) else { return };
        self.pending_runs += 1;
        self.attempts += 1;
        let attempt = format!("{:x}.{}", self.incarnation, self.attempts);
        let claim = self.claim.clone();
        let ran = self.ran_tx.clone();
        let mut job = Job {
            election: request.id,
            topic: request.topic,
            action: request.action,
            worker: self.cfg.id.clone(),
            token: None,
        };
        tokio::spawn(async move {
            let mut result = Ok(None);
            if let Some(claim) = claim {
                match claim.take(&job, &attempt).await {
                    Ok(token) => job.token = Some(token),
                    Err(e) => result = Err(e),
                }
            }
            if result.is_ok() {
                result = handler.start(&job).await;
            }
            let _ = ran.send(Ran { election: job.election, result }).await;
        });
    }

    async fn on_ran(&mut self, ran: Ran) {
        self.pending_runs -= 1;
        let (started, error) = match ran.result {
            Ok(task) => {
                info!(election = %ran.election, "won; action started");
                self.running.extend(task);
                self.emit(Event::Started { election: ran.election.clone() });
                (true, None)
            }
            Err(e) => {
                warn!(election = %ran.election, error = %e, "won; action not started");
                self.emit(Event::NotStarted { election: ran.election.clone(), error: e.clone() });
                (false, Some(e))
            }
        };
        let outcome = Outcome { id: ran.election, winner: Some(self.cfg.id.clone()), started, error, repeat: false };
        self.publish_outcome(outcome).await;
    }

    async fn publish_outcome(&mut self, outcome: Outcome) {
        if let Some(f) = self.finished.get_mut(&outcome.id) {
            f.outcome = Some(outcome.clone());
        }
        self.send(Body::Outcome(outcome)).await;
    }

    fn on_outcome(&mut self, from: &str, outcome: Outcome) {
        if let Some(e) = self.elections.get_mut(&outcome.id) {
            // Reported before this worker decided: compared when it does.
            e.reported.get_or_insert((from.to_string(), outcome));
            return;
        }
        let Some(f) = self.finished.get(&outcome.id) else { return };
        if f.outcome.is_none() && f.winner != outcome.winner {
            let ours = f.winner.clone();
            self.disagree(from, outcome, ours);
        }
    }

    fn disagree(&self, from: &str, outcome: Outcome, ours: Option<String>) {
        warn!(
            election = %outcome.id,
            ours = ours.as_deref().unwrap_or("-"),
            theirs = outcome.winner.as_deref().unwrap_or("-"),
            %from,
            "another worker reports a different winner"
        );
        self.emit(Event::Disagreement { election: outcome.id, ours, theirs: outcome.winner, from: from.into() });
    }

    fn remember(&mut self, id: &str, finished: Finished) {
        self.finished.insert(id.to_string(), finished);
        self.finished_order.push_back((Instant::now(), id.to_string()));
        while self.finished_order.len() > MAX_REMEMBERED {
            if let Some((_, old)) = self.finished_order.pop_front() {
                self.finished.remove(&old);
            }
        }
    }

    async fn tick(&mut self) {
        let now = Instant::now();
        if !self.joined && now >= self.join_done {
            self.joined = true;
            let members: Vec<String> = self.members.keys().cloned().collect();
            info!(worker = %self.cfg.id, clock = self.clock, ?members, "joined");
            self.emit(Event::Joined { members });
            if let Some(tx) = self.joined_tx.take() {
                let _ = tx.send(());
            }
        }
        if now >= self.next_heartbeat {
            self.send(Body::Heartbeat).await;
            self.next_heartbeat = now + self.cfg.heartbeat;
        }
        let lost: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| now.duration_since(m.last_seen) > self.cfg.lost_after)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lost {
            self.members.remove(&id);
            warn!(member = %id, "member lost");
            self.emit(Event::MemberLost(id));
        }
        let due: Vec<String> =
            self.elections.iter().filter(|(_, e)| now >= e.deadline).map(|(id, _)| id.clone()).collect();
        for id in due {
            self.check(&id).await;
        }
        while let Some((at, id)) = self.finished_order.front() {
            if now.duration_since(*at) < self.cfg.retention {
                break;
            }
            self.finished.remove(id);
            self.finished_order.pop_front();
        }
        let give_up = self.cfg.give_up_after();
        self.left.retain(|_, at| now.duration_since(*at) < give_up);
        self.running.retain(|t| !t.is_finished());
    }

    fn next_wake(&self) -> Instant {
        let mut wake = self.next_heartbeat;
        if !self.joined {
            wake = wake.min(self.join_done);
        }
        for m in self.members.values() {
            wake = wake.min(m.last_seen + self.cfg.lost_after + Duration::from_millis(1));
        }
        for e in self.elections.values() {
            wake = wake.min(if Instant::now() < e.deadline { e.deadline } else { e.give_up });
        }
        if let Some((at, _)) = self.finished_order.front() {
            wake = wake.min(*at + self.cfg.retention);
        }
        wake
    }
}
