//! The worker: membership, elections, and running the won ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::handler::{Claim, Handlers, Job};
use crate::message::{Body, Envelope, Outcome, Ref, Request, VERSION};
use crate::rule::{self, Bid};
use crate::transport::{Link, Publisher, Transport};
use crate::{GossipError, check_topic};

/// How many decided election ids a worker remembers at most (besides [`Config::retention`]).
const MAX_REMEMBERED: usize = 100_000;
/// The highest clock a received message can move this worker's clock to.
const MAX_CLOCK: u64 = 1 << 62;
/// How many of its own messages a worker tracks until they come back.
const MAX_IN_FLIGHT: usize = 100_000;
/// How many answers heard before their request a worker keeps at most.
const MAX_EARLY: usize = 10_000;
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
    /// heartbeats and half an interval of slack). At least twice the heartbeat.
    pub lost_after: Duration,
    /// How long a joining worker collects the members' clocks before it stands in
    /// elections (500 ms). It also listens for [`Config::lost_after`] at least, so that
    /// it knows every member the others still count as live.
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

    /// How long a worker may go without running before it counts itself as stalled (a
    /// frozen process, a paused VM, a publish that hung): half of [`Config::lost_after`].
    /// It wakes at least every half heartbeat. It then gives up the elections under way
    /// and joins again. A shorter stall that kept its messages from the broker long enough
    /// for the others to lose it is caught by [`Config::echo_limit`] instead.
    pub fn stall_limit(&self) -> Duration {
        self.lost_after / 2
    }

    /// How long a worker may go without the broker delivering its own messages back (its
    /// heartbeats among them) before it counts itself as cut off: half a heartbeat before
    /// the others could lose it. It then gives up the elections under way and joins again.
    pub fn echo_limit(&self) -> Duration {
        self.lost_after.saturating_sub(self.heartbeat / 2)
    }

    /// How long after a member's last word this worker must have sent a message of its
    /// own, and read it back, before it may count the member lost: a quarter heartbeat past
    /// [`Config::echo_limit`]. The broker then delivered nothing from the member for that
    /// long, and a member that runs checks, before it acts on anything, whether anything
    /// of its own came back within `echo_limit`: so a member lost this way has cut itself
    /// off (given up its elections), or will before it acts again. The quarter heartbeat
    /// covers two hosts' clocks running at slightly different rates.
    pub fn lost_proof(&self) -> Duration {
        if mutant("lost-on-short-silence") {
            // Planted: the proof this rule replaced, a heartbeat short of lost_after, which
            // is shorter than a silence a running member can keep without noticing.
            return self.lost_after.saturating_sub(self.heartbeat);
        }
        self.echo_limit() + self.heartbeat / 4
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
        if self.lost_after < self.heartbeat * 2 {
            return bad(format!(
                "lost-after ({:?}) must be at least twice the heartbeat interval ({:?})",
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
    /// The broker connection was lost, or a publish on it failed; the worker gives up the
    /// elections under way, makes a new connection and joins again.
    LinkLost,
    /// This worker was stalled (it did not run for longer than [`Config::stall_limit`]:
    /// a frozen process, a paused VM) or cut off (it stopped hearing its own messages
    /// back): it gave up the elections under way and joins again.
    Rejoining {
        /// What happened.
        reason: String,
    },
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
            hello_clock: 0,
            hello_echoed: false,
            last_awake: now,
            last_awake_wall: std::time::SystemTime::now(),
            last_suspended: tenure::host_suspended(),
            last_echo: now,
            in_flight: VecDeque::new(),
            joined_tx: Some(joined_tx),
            relink: false,
            last_relink: now,
            draining: false,
            elections: BTreeMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
            early: HashMap::new(),
            early_order: VecDeque::new(),
            next_heartbeat: now,
            ran_tx,
            pending_runs: 0,
            attempts: 0,
            running: Vec::new(),
            ask_again: Vec::new(),
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

/// Tells whoever asked the worker to leave that it has; the worker's result.
fn left(shutdown: Option<oneshot::Sender<()>>) -> Result<(), GossipError> {
    if let Some(reply) = shutdown {
        let _ = reply.send(());
    }
    Ok(())
}

use tenure::mutant;

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
    /// The process behind the id: the incarnation of its first message heard, then of its
    /// latest `hello` (a restarted process says `hello` first). A `leave` from another
    /// incarnation (a late or duplicated one from before a restart) does not remove it.
    incarnation: u64,
    /// Whether its latest heartbeat said it has joined (stands in elections).
    joined: bool,
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Candidate { clock: u64, handles: bool },
    Abstain,
}

/// An election this worker stands in (or will, once joined) and has not decided yet.
struct Election {
    request: Request,
    digest: String,
    /// Whether this worker has stood: at once when it was joined when the request came, or
    /// when it joined (a deferred election).
    standing: bool,
    /// The members whose `hello` this worker read after the request: they subscribed after
    /// it or were not joined when it came, so they never stand in it, and a deferred
    /// election leaves them out of its member set.
    late_hellos: BTreeSet<String>,
    /// The members this worker knew when it heard the request (deferred elections): one of
    /// them whose `hello` comes after the request was cut off and is rejoining (a broker
    /// restart). It stays in the member set (it may have decided this id before, and its
    /// word must be waited for), and the request is published again for it to hear.
    known: BTreeSet<String>,
    /// The members this worker stood with, itself included: the live set when it heard the
    /// request, or (deferred) when it joined, less `late_hellos`. Empty until it stands.
    members: BTreeSet<String>,
    /// The answers heard back from the broker, this worker's own included.
    answers: BTreeMap<String, Answer>,
    /// An outcome another worker reported before this one decided: checked at the decision.
    reported: Option<(String, Outcome)>,
    deadline: Instant,
    give_up: Instant,
}

/// An election id this worker is done with.
struct Finished {
    /// Whether this worker decided it (rather than gave it up or only abstained).
    decided: bool,
    winner: Option<String>,
    /// The outcome this worker published (as winner or reporter), to repeat on request.
    outcome: Option<Outcome>,
}

impl Finished {
    /// Given up, or answered with an abstention only: nothing to repeat or compare.
    fn undecided() -> Self {
        Finished { decided: false, winner: None, outcome: None }
    }
}

/// An answer heard before its request (a broker without one order for all senders).
struct Early {
    from: String,
    digest: String,
    answer: Answer,
}

struct Ran {
    request: Request,
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
    /// Standing in elections: a message of its own sent at the end of the join wait
    /// (`join_done`) has come back, and with it the latest `hello`.
    joined: bool,
    join_done: Instant,
    /// The clock of the latest `hello`, and whether the broker has delivered it back:
    /// everything queued before it was sent before this worker (re)joined.
    hello_clock: u64,
    hello_echoed: bool,
    /// When this worker last ran (a longer gap than [`Config::stall_limit`] is a stall),
    /// and the wall clock and the host's suspended time then: a paused VM or a suspended
    /// host may stop the monotonic clock, not these.
    last_awake: Instant,
    last_awake_wall: std::time::SystemTime,
    last_suspended: Duration,
    /// When this worker *sent* the latest of its own messages the broker has delivered
    /// back, of the kinds the others count as a sign of life: everything published before
    /// that instant has been read, and the others have heard this worker since. Judged by send
    /// time, not read time, so that a worker behind its queue does not take messages
    /// it has not read yet for silence.
    last_echo: Instant,
    /// This worker's messages not delivered back yet: clock and send time, oldest first.
    in_flight: VecDeque<(u64, Instant)>,
    joined_tx: Option<oneshot::Sender<()>>,
    /// The link is to be dropped and made again (after an echo cut-off or a failed
    /// publish), and when it last was.
    relink: bool,
    last_relink: Instant,
    draining: bool,
    elections: BTreeMap<String, Election>,
    finished: HashMap<String, Finished>,
    finished_order: VecDeque<(Instant, String)>,
    /// Answers to elections not heard of yet, by id; dropped after the give-up time.
    early: HashMap<String, Vec<Early>>,
    early_order: VecDeque<(Instant, String)>,
    next_heartbeat: Instant,
    ran_tx: mpsc::Sender<Ran>,
    pending_runs: usize,
    attempts: u64,
    running: Vec<JoinHandle<()>>,
    /// Requests to publish again, for members that rejoined after hearing them (see
    /// [`Election::known`]).
    ask_again: Vec<Request>,
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
            if std::mem::take(&mut self.relink) {
                info!(broker = %self.transport.describe(), "making a new broker connection");
                // What was sent or heard on the old link may be lost: decide nothing under
                // way (after a cut-off there is nothing left to give up).
                self.abandon_all("the broker connection is being remade");
                // At most one new connection per half heartbeat, however often publishing fails.
                tokio::time::sleep_until(self.last_relink + self.cfg.heartbeat / 2).await;
                self.last_relink = Instant::now();
                match self.reconnect(&mut commands, &mut shutdown).await {
                    Some(l) => link = l,
                    None => return left(shutdown),
                }
                self.rejoin().await;
            }
            let wake = self.next_wake();
            tokio::select! {
                m = link.messages.recv() => {
                    // First: was this worker stalled? Then what waited in the queue is
                    // read as by a worker that is joining again.
                    self.awake().await;
                    match m {
                        Some(bytes) => self.on_bytes(&bytes).await,
                        None => {
                            warn!(broker = %self.transport.describe(), "lost the broker connection; reconnecting");
                            self.emit(Event::LinkLost);
                            // Answers may have been lost both ways, and the others may
                            // decide without this worker: decide nothing under way.
                            self.abandon_all("the broker connection was lost");
                            match self.reconnect(&mut commands, &mut shutdown).await {
                                Some(l) => link = l,
                                // Leaving without a broker: nothing more can be decided.
                                None => return left(shutdown),
                            }
                            self.rejoin().await;
                        }
                    }
                }
                Some(c) = commands.recv() => {
                    self.awake().await;
                    match c {
                        Command::Elect(request, done) => {
                            // Opened when the broker delivers it back, at its place among
                            // the others' messages, as every other worker opens it.
                            self.send(Body::Elect(request)).await;
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
                    }
                }
                Some(r) = ran.recv() => {
                    self.awake().await;
                    self.on_ran(r).await;
                }
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
        // Sent as of now: what the broker delivers after it was published after this.
        if self.in_flight.len() >= MAX_IN_FLIGHT {
            self.in_flight.pop_front();
        }
        self.in_flight.push_back((env.clock, Instant::now()));
        if let Err(e) = self.publisher.publish(env.encode()).await {
            // Failed or timed out: the link may be half broken (publishing fails while the
            // subscription lives), which no echo check catches if the publish also stalls
            // this worker. Make a new one.
            warn!(error = %crate::chain(&e), "cannot publish; making a new broker connection");
            if !std::mem::replace(&mut self.relink, true) {
                self.emit(Event::LinkLost);
            }
        }
        env.clock
    }

    async fn begin_join(&mut self) {
        let now = Instant::now();
        self.joined = false;
        self.hello_echoed = false;
        self.join_done = if mutant("join-without-listening") {
            // Planted: joining after join_wait alone, before every live member was heard.
            now + self.cfg.join_wait
        } else {
            now + self.cfg.join_wait.max(self.cfg.lost_after)
        };
        self.next_heartbeat = now + self.cfg.heartbeat;
        self.hello_clock = self.send(Body::Hello).await;
    }

    /// Checks, before anything else is done, whether this worker was stalled: it did not
    /// run for longer than [`Config::stall_limit`] (a frozen process, a paused VM, a
    /// publish that hung). The others may have lost it meanwhile and decided without it,
    /// and what it would judge now (members silent for that long) is its own silence.
    async fn awake(&mut self) {
        let now = Instant::now();
        let wall = std::time::SystemTime::now();
        let suspended = tenure::host_suspended();
        // The largest of three clocks' gaps: the monotonic clock's, that plus the time the
        // host spent suspended, and the wall clock's (which a resumed VM's guest sets
        // right). A wall clock stepped forward only costs a needless rejoin.
        let gap = (now.duration_since(self.last_awake) + suspended.saturating_sub(self.last_suspended))
            .max(wall.duration_since(self.last_awake_wall).unwrap_or_default());
        self.last_awake = now;
        self.last_awake_wall = wall;
        self.last_suspended = suspended;
        if gap > self.cfg.stall_limit() {
            self.cut_off(format!("stalled for {gap:?}")).await;
            return;
        }
        // Checked before anything read is acted on, as the stall is.
        let silent = now.duration_since(self.last_echo);
        if silent > self.cfg.echo_limit() {
            // Nothing this worker sent in that time has come back (its heartbeats included):
            // the broker is not delivering it, or this worker is that far behind its queue.
            // The others may not hear it either, and may soon lose it. Its link may be
            // half broken (publishing fails while the subscription lives): make a new one.
            self.relink = true;
            self.cut_off(format!("nothing it sent in the last {silent:?} has come back")).await;
        }
    }

    /// Stalled or cut off: give up the elections under way (the others may decide them
    /// without this worker's answer, or have done so) and join again, judging no member
    /// by the silence this worker itself caused.
    async fn cut_off(&mut self, reason: String) {
        warn!(worker = %self.cfg.id, %reason, "giving up the elections under way and joining again");
        self.abandon_all(&reason);
        self.emit(Event::Rejoining { reason });
        self.rejoin().await;
    }

    /// Gives up every election under way; none of them will run here.
    fn abandon_all(&mut self, why: &str) {
        for (id, e) in std::mem::take(&mut self.elections) {
            let waiting: Vec<String> = e.members.iter().filter(|w| !e.answers.contains_key(*w)).cloned().collect();
            warn!(election = %id, %why, "gave the election up");
            self.remember(&id, Finished::undecided());
            self.emit(Event::Abandoned { election: id, waiting });
        }
        self.early.clear();
        self.early_order.clear();
    }

    /// Joins again after a stall or a reconnect: the members get a fresh `lost_after` to
    /// be heard from, and this worker abstains until its new `hello` comes back.
    async fn rejoin(&mut self) {
        let now = Instant::now();
        for m in self.members.values_mut() {
            m.last_seen = now;
            // Whether they have joined is to be heard again (after a broker restart every
            // member is rejoining too): until then, an election is deferred, not abstained from.
            m.joined = false;
        }
        self.last_awake = now;
        self.last_awake_wall = std::time::SystemTime::now();
        self.last_suspended = tenure::host_suspended();
        self.last_echo = now;
        self.begin_join().await;
    }

    async fn on_bytes(&mut self, bytes: &[u8]) {
        let Some(env) = Envelope::decode(bytes) else {
            debug!(len = bytes.len(), "ignoring a message that is not ours");
            return;
        };
        if env.from == self.cfg.id {
            if env.incarnation != self.incarnation {
                tracing::error!(id = %env.from, "another process uses this worker id; give each worker its own id");
                return;
            }
            self.on_echo(env).await;
            return;
        }
        // No honest worker counts near MAX_CLOCK: one bad message must not push every clock
        // to the end of its range, where they would stop growing (its bid simply loses).
        self.clock = self.clock.max(env.clock.min(MAX_CLOCK)).saturating_add(1);
        let from = env.from.clone();
        if env.body.is_sign_of_life() {
            self.saw_worker(&from, env.incarnation, matches!(env.body, Body::Hello));
            for request in std::mem::take(&mut self.ask_again) {
                debug!(election = %request.id, member = %from, "asking again for a member that rejoined");
                self.send(Body::Elect(request)).await;
            }
        }
        match env.body {
            Body::Hello | Body::Probe => {
                self.send(Body::Heartbeat { joined: self.joined }).await;
            }
            Body::Heartbeat { joined } => {
                if let Some(m) = self.members.get_mut(&from) {
                    m.joined = joined;
                }
            }
            Body::Leave => {
                let earlier_process = self.members.get(&from).is_some_and(|m| m.incarnation != env.incarnation);
                if earlier_process && !mutant("leave-any-incarnation") {
                    debug!(member = %from, "ignoring a leave from an earlier process with this id");
                    return;
                }
                if self.members.remove(&from).is_some() {
                    info!(member = %from, "member left");
                    self.emit(Event::MemberLeft(from.clone()));
                }
                self.left.insert(from, Instant::now());
            }
            Body::Elect(request) => self.on_request(request).await,
            Body::Candidate { election, handles } => {
                self.on_answer(from, election, Answer::Candidate { clock: env.clock, handles }).await;
            }
            Body::Abstain { election } => self.on_answer(from, election, Answer::Abstain).await,
            // Not an answer: the sender stands once it has joined, and is waited for as any
            // member is.
            Body::Defer { .. } => {}
            Body::Outcome(outcome) => self.on_outcome(&from, outcome),
        }
    }

    /// One of this worker's own messages, delivered back by the broker: proof that the
    /// others can hear it, and the moment it counts. A request this worker sent opens
    /// here, and its own answer counts only now (one that failed to publish never does).
    async fn on_echo(&mut self, env: Envelope) {
        // Messages come back in the order they were sent: drop those before this one
        // (they failed to publish), and credit this one's send time.
        while self.in_flight.front().is_some_and(|&(clock, _)| clock < env.clock) {
            self.in_flight.pop_front();
        }
        // Only what the others count as a sign of life: a request of its own that came
        // back says nothing of whether they still hear this worker.
        let counted = env.body.is_sign_of_life() || mutant("any-echo-counts");
        if let Some(&(clock, sent)) = self.in_flight.front()
            && clock == env.clock
        {
            self.in_flight.pop_front();
            if counted {
                self.last_echo = self.last_echo.max(sent);
            }
        }
        // The `hello`, or anything sent after it: everything queued before it has been read
        // (a `hello` that failed to publish must not keep this worker from joining).
        if env.clock >= self.hello_clock {
            self.hello_echoed = true;
        }
        match env.body {
            Body::Elect(request) => self.on_request(request).await,
            Body::Candidate { election, handles } => {
                let me = self.cfg.id.clone();
                self.on_answer(me, election, Answer::Candidate { clock: env.clock, handles }).await;
            }
            _ => {}
        }
    }

    fn saw_worker(&mut self, from: &str, incarnation: u64, hello: bool) {
        let now = Instant::now();
        self.left.remove(from);
        if hello && !mutant("defer-keeps-late-hellos") {
            // Planted, defer-keeps-late-hellos: a deferred election waits for workers that
            // never saw its request.
            for e in self.elections.values_mut().filter(|e| !e.standing) {
                // (Planted, defer-drops-known-members: a member known before the request
                // and rejoining is left out, so a worker that decided this id before is
                // not waited for.)
                if e.known.contains(from) && !mutant("defer-drops-known-members") {
                    self.ask_again.push(e.request.clone());
                } else {
                    e.late_hellos.insert(from.to_string());
                }
            }
        }
        match self.members.get_mut(from) {
            Some(m) => {
                m.last_seen = now;
                if hello {
                    m.incarnation = incarnation;
                    m.joined = false;
                }
            }
            None => {
                self.members.insert(from.to_string(), Member { last_seen: now, incarnation, joined: false });
                if self.joined {
                    info!(member = %from, "member joined");
                    self.emit(Event::MemberJoined(from.to_string()));
                }
            }
        }
    }

    /// A request: this worker stands in it (fixing its member set now) or, while joining
    /// or leaving, abstains once and follows it no further.
    async fn on_request(&mut self, request: Request) {
        let id = request.id.clone();
        if let Some(f) = self.finished.get(&id) {
            // A repeated request for a decided id: whoever published its outcome repeats it
            // (with the first request's topic and digest, so a different action under the
            // same id is told so).
            if let Some(outcome) = &f.outcome {
                let repeat = Outcome { repeat: true, ..outcome.clone() };
                self.send(Body::Outcome(repeat)).await;
            }
            return;
        }
        if self.elections.contains_key(&id) {
            return;
        }
        if checked_request(&request.id, &request.topic, &request.action).is_err() {
            warn!(election = %request.id, "ignoring an election with an invalid id, topic or action");
            return;
        }
        // Defer rather than abstain while joining if its `hello` came before the request
        // (everyone who reads both counts it as a member) and no member it knows has
        // joined (nobody else may decide it now: the whole group is starting or rejoining).
        // (Planted, defer-before-hello: deferring a request read before its own hello.)
        let may_defer = (self.hello_echoed || mutant("defer-before-hello"))
            && !self.members.values().any(|m| m.joined)
            && !self.draining;
        let defer = !self.joined && may_defer;
        let early = self.early.remove(&id).unwrap_or_default();
        if !defer && (!self.joined || self.draining) {
            // Answer once so that nobody waits for this worker; never stand in it later,
            // never decide or report it.
            self.send(Body::Abstain { election: request.reference() }).await;
            self.remember(&id, Finished::undecided());
            return;
        }
        let digest = request.digest();
        let mut answers = BTreeMap::new();
        for a in early.into_iter().filter(|a| a.digest == digest) {
            answers.entry(a.from).or_insert(a.answer);
        }
        if defer {
            info!(election = %id, "joining: will stand in the election once joined");
            self.send(Body::Defer { election: request.reference() }).await;
        }
        // A deferred election is given up if this worker has not joined by then; standing
        // restarts both clocks.
        let give_up = Instant::now() + self.cfg.give_up_after();
        let election = Election {
            request,
            digest,
            standing: false,
            late_hellos: BTreeSet::new(),
            known: self.members.keys().cloned().collect(),
            members: BTreeSet::new(),
            answers,
            reported: None,
            deadline: give_up,
            give_up,
        };
        self.elections.insert(id.clone(), election);
        if !defer {
            self.stand(&id).await;
        }
    }

    /// Stands in election `id`: fixes its member set (the live members this worker knows,
    /// itself included, less those whose `hello` came after the request), announces its
    /// candidacy, and starts the election's clocks.
    async fn stand(&mut self, id: &str) {
        let Some(e) = self.elections.get(id) else { return };
        let mut members: BTreeSet<String> =
            self.members.keys().filter(|m| !e.late_hellos.contains(*m)).cloned().collect();
        members.insert(self.cfg.id.clone());
        let handles = self.handlers.get(&e.request.topic).is_some();
        let reference = e.request.reference();
        self.send(Body::Candidate { election: reference, handles }).await;
        debug!(election = %id, members = members.len(), "election started");
        let now = Instant::now();
        let (deadline, give_up) = (now + self.cfg.election_timeout, now + self.cfg.give_up_after());
        if let Some(e) = self.elections.get_mut(id) {
            e.standing = true;
            e.members = members;
            e.deadline = deadline;
            e.give_up = give_up;
        }
        self.check(id).await;
    }

    /// An answer: counted for the election it names if this worker stands in it with the
    /// same request; kept a while if its request has not come yet; never opens one.
    async fn on_answer(&mut self, from: String, election: Ref, answer: Answer) {
        if let Some(e) = self.elections.get_mut(&election.id) {
            if e.digest == election.digest {
                e.answers.entry(from).or_insert(answer);
                self.check(&election.id).await;
            } else {
                debug!(election = %election.id, %from, "ignoring an answer to another request under the same id");
            }
            return;
        }
        if self.finished.contains_key(&election.id) || !self.joined {
            return;
        }
        while self.early_order.len() >= MAX_EARLY {
            if let Some((_, old)) = self.early_order.pop_front() {
                self.early.remove(&old);
            }
        }
        let list = self.early.entry(election.id.clone()).or_default();
        if list.is_empty() {
            self.early_order.push_back((Instant::now(), election.id));
        }
        list.push(Early { from, digest: election.digest, answer });
    }

    fn is_live(&self, worker: &str) -> bool {
        worker == self.cfg.id || self.members.contains_key(worker)
    }

    /// Decides `id` if every awaited member has answered, or gives it up when too late.
    async fn check(&mut self, id: &str) {
        let Some(e) = self.elections.get(id) else { return };
        let now = Instant::now();
        if !e.standing {
            // Deferred, and this worker never joined in time (it stands when it joins).
            if now >= e.give_up {
                self.elections.remove(id);
                warn!(election = %id, "gave the election up: this worker did not join in time to stand in it");
                self.remember(id, Finished::undecided());
                self.emit(Event::Abandoned { election: id.to_string(), waiting: vec![self.cfg.id.clone()] });
            }
            return;
        }
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
            self.remember(id, Finished::undecided());
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
        // Who tells the initiator when nobody can run it: the first candidate by the same
        // rule (this worker stood, so there is one).
        let reporter = winner.clone().or_else(|| rule::winner(&all).map(|b| b.worker.clone()));
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
            && outcome.digest == e.digest
            && outcome.winner != winner
        {
            self.disagree(from, outcome.clone(), winner.clone());
        }
        let mine = reporter.as_deref() == Some(self.cfg.id.as_str());
        self.remember(id, Finished { decided: true, winner: winner.clone(), outcome: None });
        // Another worker already reports that it won and started this very request: this
        // worker decided on another view (it was paused, or a split healed). Running it
        // too would run it twice.
        let ran_elsewhere = e
            .reported
            .as_ref()
            .is_some_and(|(_, o)| o.digest == e.digest && o.started && o.winner.is_some() && o.winner != winner);
        if winner.as_deref() == Some(self.cfg.id.as_str()) && ran_elsewhere {
            let error = "another worker reports that it already won and started it".to_string();
            warn!(election = %request.id, "won, but {error}; not starting it");
            self.emit(Event::NotStarted { election: request.id.clone(), error });
        } else if winner.as_deref() == Some(self.cfg.id.as_str()) {
            self.start_action(request);
        } else if winner.is_none() && mine {
            let error = format!("no live worker has a handler for topic {:?}", request.topic);
            let outcome = Outcome {
                id: request.id.clone(),
                topic: request.topic.clone(),
                digest: e.digest,
                winner: None,
                started: false,
                error: Some(error),
                repeat: false,
            };
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
            election: request.id.clone(),
            topic: request.topic.clone(),
            action: request.action.clone(),
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
            let _ = ran.send(Ran { request, result }).await;
        });
    }

    async fn on_ran(&mut self, ran: Ran) {
        self.pending_runs -= 1;
        let election = ran.request.id.clone();
        let (started, error) = match ran.result {
            Ok(task) => {
                info!(%election, "won; action started");
                self.running.extend(task);
                self.emit(Event::Started { election: election.clone() });
                (true, None)
            }
            Err(e) => {
                warn!(%election, error = %e, "won; action not started");
                self.emit(Event::NotStarted { election: election.clone(), error: e.clone() });
                (false, Some(e))
            }
        };
        let outcome = Outcome {
            id: election,
            topic: ran.request.topic.clone(),
            digest: ran.request.digest(),
            winner: Some(self.cfg.id.clone()),
            started,
            error,
            repeat: false,
        };
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
            // Reported before this worker decided: compared when it does. A report that
            // the action started outweighs any other.
            let started = outcome.started && outcome.digest == e.digest;
            if e.reported.is_none() || started {
                e.reported = Some((from.to_string(), outcome));
            }
            return;
        }
        let Some(f) = self.finished.get(&outcome.id) else { return };
        // The winner too: two winners (a worker lost while it was deciding, a split that
        // healed) are each the only ones who can tell that both ran.
        // (Planted, winner-keeps-quiet: only a worker that published no outcome reports.)
        if f.decided && f.winner != outcome.winner && (f.outcome.is_none() || !mutant("winner-keeps-quiet")) {
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
        self.awake().await;
        let now = Instant::now();
        // Joined once a message of its own sent at join_done has come back: it has then read
        // everything published in the join wait, however far behind its queue it was.
        // (Planted, join-on-local-time: joined by this worker's clock alone.)
        let listened = self.last_echo >= self.join_done || mutant("join-on-local-time");
        if !self.joined && self.hello_echoed && now >= self.join_done && listened {
            self.joined = true;
            let members: Vec<String> = self.members.keys().cloned().collect();
            info!(worker = %self.cfg.id, clock = self.clock, ?members, "joined");
            self.emit(Event::Joined { members });
            if let Some(tx) = self.joined_tx.take() {
                let _ = tx.send(());
            }
            let deferred: Vec<String> =
                self.elections.iter().filter(|(_, e)| !e.standing).map(|(id, _)| id.clone()).collect();
            for id in deferred {
                info!(election = %id, "joined: standing in the election it deferred");
                self.stand(&id).await;
            }
        }
        // A member silent for lost_proof, and nothing this worker sent since then on its
        // way: a heartbeat now brings the proof back in a round trip, not at the next beat.
        let proof = self.cfg.lost_proof();
        let latest_sent = self.latest_sent();
        if now >= self.next_heartbeat
            || self.members.values().any(|m| now >= m.last_seen + proof && latest_sent < m.last_seen + proof)
            || (!self.joined && now >= self.join_done && latest_sent < self.join_done)
        {
            self.send(Body::Heartbeat { joined: self.joined }).await;
            self.next_heartbeat = now + self.cfg.heartbeat;
        }
        // Lost: silent for lost_after, while this worker has read back a message of its own
        // sent lost_proof after the member's last word (so the silence is the member's, not
        // this worker's deafness or backlog: what the member sent before that message was
        // read; and long enough that the member, if running, has cut itself off).
        let heard_since = self.cfg.lost_proof();
        let lost: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                now.duration_since(m.last_seen) > self.cfg.lost_after && self.last_echo >= m.last_seen + heard_since
            })
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
        while let Some((at, id)) = self.early_order.front() {
            if now.duration_since(*at) < give_up {
                break;
            }
            self.early.remove(id);
            self.early_order.pop_front();
        }
        self.left.retain(|_, at| now.duration_since(*at) < give_up);
        self.running.retain(|t| !t.is_finished());
    }

    /// When this worker sent its newest message, delivered back or not.
    fn latest_sent(&self) -> Instant {
        self.in_flight.back().map_or(self.last_echo, |&(_, sent)| sent.max(self.last_echo))
    }

    fn next_wake(&self) -> Instant {
        // At least every half heartbeat, so that a gap of stall_limit means a stall.
        let mut wake = self
            .next_heartbeat
            .min(self.last_awake + self.cfg.heartbeat / 2)
            .min(self.last_echo + self.cfg.echo_limit() + Duration::from_millis(1));
        // At join_done: to send the message whose echo ends the join (see tick), or to join.
        if !self.joined && (self.latest_sent() < self.join_done || self.last_echo >= self.join_done) {
            wake = wake.min(self.join_done);
        }
        // A member can be lost once silent for lost_after, if this worker has heard itself
        // since (otherwise the next echo, a message, wakes it).
        let heard_since = self.cfg.lost_proof();
        let latest_sent = self.latest_sent();
        for m in self.members.values() {
            if self.last_echo >= m.last_seen + heard_since {
                wake = wake.min(m.last_seen + self.cfg.lost_after + Duration::from_millis(1));
            } else if latest_sent < m.last_seen + heard_since {
                // Time to send the proof (see tick).
                wake = wake.min(m.last_seen + heard_since);
            }
        }
        for e in self.elections.values() {
            wake = wake.min(if Instant::now() < e.deadline { e.deadline } else { e.give_up });
        }
        if let Some((at, _)) = self.finished_order.front() {
            wake = wake.min(*at + self.cfg.retention);
        }
        if let Some((at, _)) = self.early_order.front() {
            wake = wake.min(*at + self.cfg.give_up_after());
        }
        wake
    }
}
