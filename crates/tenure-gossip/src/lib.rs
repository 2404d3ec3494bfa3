//! Broker gossip elections: a group of workers that share a message broker agrees, for
//! one election id, which single live worker runs an action.
//!
//! Workers keep a Lamport clock, join the group by asking its members for their clocks,
//! and send heartbeats; a worker silent for longer than [`Config::lost_after`] is lost.
//! An election ([`Client::elect`] or [`Worker::elect`]) is broadcast; each worker fixes
//! the live set it knows at that moment (itself included) and announces its candidacy,
//! stamped with its clock. A worker decides only when it holds the announcement of every
//! worker in that set or, after [`Config::election_timeout`], of every one still live;
//! the winner is the lowest clock, ties broken by the lower worker id ([`winner`]). The
//! winner runs the handler registered for the election's topic and broadcasts the
//! [`Outcome`]. With a [`Claim`], the winner first takes the election id on a lease
//! store, so that not even a network split runs an action twice.
//!
//! Without a claim an action runs at most once per id (within [`Config::retention`])
//! through crashes, stalls, broker outages and joins: a worker that was stalled or cut
//! off ([`Config::stall_limit`], [`Config::echo_limit`], a reconnect) gives up the
//! elections under way instead of deciding them on what it alone heard, counts its own
//! answers only once the broker delivers them back, and stands in nothing until its
//! `hello` has come back. An election asked while the whole group is starting or rejoining
//! (a broker restart) is deferred by each worker and decided once they have joined; a
//! [`Client`] waits out a broker that is down within its wait. An action may still not run
//! at all (an election under way when a worker is cut off); a network split can run it
//! once per side.
//!
//! Transports: Redis pub/sub and AMQP 0-9-1 ([`connect`]), and an in-process hub for
//! tests. The protocol, its guarantees and its limits are in `docs/gossip.md`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_gossip::GossipError> {
//! use std::time::Duration;
//! use tenure_gossip::{Client, Config, Handlers, Worker, connect};
//!
//! let transport = connect("redis://127.0.0.1:6379", "default")?;
//! let worker = Worker::start(transport.clone(), Config::default(), Handlers::with_command(), None).await?;
//! let client = Client::connect(transport.clone()).await?;
//! let outcome = client.elect("report-2026-11-21", "command", "./report.sh", Duration::from_secs(10)).await?;
//! println!("{:?} runs it", outcome.winner);
//! worker.shutdown().await?;
//! # Ok(()) }
//! ```

mod client;
mod handler;
mod message;
mod rule;
pub mod transport;
mod worker;

pub use client::{Client, MemberInfo};
pub use handler::{COMMAND_TOPIC, Claim, CommandHandler, Handler, Handlers, Job, check_topic};
pub use message::Outcome;
pub use rule::{Bid, winner};
pub use transport::{AmqpTransport, Link, MemoryHub, Publisher, RedisTransport, Transport, connect};
pub use worker::{Config, Decision, Event, Worker, default_worker_id};

/// A boxed error, the source of a [`GossipError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The broker URL cannot be used.
    #[error("bad broker URL {url:?}: {reason}")]
    BadUrl {
        /// The URL, without its password.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The broker could not be reached, refused us, or failed a request.
    #[error("{message}")]
    Broker {
        /// What failed.
        message: String,
        /// Why.
        #[source]
        source: Option<BoxError>,
    },
    /// A name, topic or setting was refused.
    #[error("{0}")]
    Invalid(String),
    /// No worker answered the election in time.
    #[error(
        "no worker answered election {id} within {wait:?}: no worker is running in this group, or the id was \
         decided before by a worker that has since gone"
    )]
    NoWorkers {
        /// The election id.
        id: String,
        /// How long the client waited.
        wait: std::time::Duration,
    },
    /// Workers answered, but no outcome came in time.
    #[error("{} worker(s) answered election {id} ({}), but no outcome came within {wait:?}", answered.len(), answered.join(", "))]
    NoOutcome {
        /// The election id.
        id: String,
        /// The workers that answered.
        answered: Vec<String>,
        /// How long the client waited.
        wait: std::time::Duration,
    },
    /// The election id was used before for another topic or action: nothing ran for
    /// this request.
    #[error(
        "election id {id} was used before for another action (topic {topic:?}, run by {}); nothing was run \
         for this request: give each action an id of its own",
        winner.as_deref().unwrap_or("no worker")
    )]
    IdInUse {
        /// The election id.
        id: String,
        /// The topic of the earlier election under this id.
        topic: String,
        /// Who won the earlier election.
        winner: Option<String>,
    },
    /// The worker has stopped.
    #[error("the worker has stopped")]
    Stopped,
}

impl GossipError {
    pub(crate) fn bad_url(url: &str, reason: impl Into<String>) -> Self {
        GossipError::BadUrl { url: tenure::store::url::redact(url), reason: reason.into() }
    }

    pub(crate) fn broker(message: impl Into<String>, source: impl Into<Option<BoxError>>) -> Self {
        GossipError::Broker { message: message.into(), source: source.into() }
    }
}

/// Checks a group name or topic: 1 to 100 characters of A-Z a-z 0-9 . _ - and `extra`.
pub(crate) fn check_label(what: &str, value: &str, extra: &str) -> Result<(), GossipError> {
    let ok = !value.is_empty()
        && value.len() <= 100
        && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') || extra.contains(c));
    if ok {
        Ok(())
    } else {
        Err(GossipError::Invalid(format!(
            "invalid {what} {value:?}: a {what} is 1 to 100 characters of A-Z a-z 0-9 . _ -{}",
            extra.chars().map(|c| format!(" {c}")).collect::<String>()
        )))
    }
}

/// An error and its sources, joined with ": ".
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}
