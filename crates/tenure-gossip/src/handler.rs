//! Topic handlers: what the winner of an election runs, and the optional store claim.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure::store::{Acquire, AcquireRequest, MAX_METADATA};
use tenure::{ElectionName, HolderId, LeaseStore};
use tokio::task::JoinHandle;

use crate::GossipError;

/// The built-in topic: the action is a shell command, run with `sh -c` on the winner.
pub const COMMAND_TOPIC: &str = "command";

/// One won election, as its handler sees it.
#[derive(Clone, Debug)]
pub struct Job {
    /// The election id.
    pub election: String,
    /// The election's topic.
    pub topic: String,
    /// The action's text.
    pub action: String,
    /// This worker's id (the winner).
    pub worker: String,
    /// The fencing token of the store claim, in store-backed mode.
    pub token: Option<u64>,
}

/// Runs the action of a won election.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Starts the action. `Ok` once it has started, with the task that finishes it if it
    /// goes on in the background (a worker that shuts down waits for it); `Err` says why
    /// it could not start.
    async fn start(&self, job: &Job) -> Result<Option<JoinHandle<()>>, String>;
}

/// Runs a shell command (`sh -c`), its output on the worker's stderr, with the job in its
/// environment:
/// `TENURE_GOSSIP_ELECTION`, `TENURE_GOSSIP_TOPIC`, `TENURE_GOSSIP_ACTION`,
/// `TENURE_GOSSIP_WORKER`, and `TENURE_TOKEN` in store-backed mode.
#[derive(Clone, Debug)]
pub struct CommandHandler {
    command: Option<String>,
}

impl CommandHandler {
    /// Runs the action itself as the command (the built-in `command` topic).
    pub fn action() -> Self {
        Self { command: None }
    }

    /// Runs `command` for every job; the action's text is in `TENURE_GOSSIP_ACTION`.
    pub fn fixed(command: impl Into<String>) -> Self {
        Self { command: Some(command.into()) }
    }
}

#[async_trait]
impl Handler for CommandHandler {
    async fn start(&self, job: &Job) -> Result<Option<JoinHandle<()>>, String> {
        let script = match &self.command {
            Some(c) => c.clone(),
            None if job.action.trim().is_empty() => {
                return Err(format!("the {COMMAND_TOPIC:?} topic needs an action: the command to run"));
            }
            None => job.action.clone(),
        };
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(&script)
            .env("TENURE_GOSSIP_ELECTION", &job.election)
            .env("TENURE_GOSSIP_TOPIC", &job.topic)
            .env("TENURE_GOSSIP_ACTION", &job.action)
            .env("TENURE_GOSSIP_WORKER", &job.worker)
            // A store URL given to the worker (for --claim) may carry a password.
            .env_remove("TENURE_STORE")
            .stdin(std::process::Stdio::null())
            // Kept off stdout, where the worker prints its decisions.
            .stdout(stderr_for_child()?);
        if let Some(token) = job.token {
            cmd.env("TENURE_TOKEN", token.to_string());
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start `sh -c {script}`: {e}"))?;
        let election = job.election.clone();
        Ok(Some(tokio::spawn(async move {
            match child.wait().await {
                Ok(status) if status.success() => tracing::info!(%election, "action finished"),
                Ok(status) => tracing::warn!(%election, %status, "action failed"),
                Err(e) => tracing::warn!(%election, error = %e, "cannot wait for the action"),
            }
        })))
    }
}

/// A handle on this process's stderr for a child's output.
fn stderr_for_child() -> Result<std::process::Stdio, String> {
    use std::os::fd::AsFd;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().map_err(|e| format!("cannot pass on stderr: {e}"))?;
    Ok(std::process::Stdio::from(fd))
}

/// Checks a topic: 1 to 100 characters of A-Z a-z 0-9 . _ - /
pub fn check_topic(topic: &str) -> Result<(), GossipError> {
    crate::check_label("topic", topic, "/")
}

/// The handlers a worker has, by topic.
#[derive(Clone, Default)]
pub struct Handlers {
    by_topic: BTreeMap<String, Arc<dyn Handler>>,
}

impl Handlers {
    /// No handlers at all: the worker stands in elections but never wins one.
    pub fn new() -> Self {
        Self::default()
    }

    /// The built-in `command` topic only.
    pub fn with_command() -> Self {
        let mut h = Self::new();
        h.by_topic.insert(COMMAND_TOPIC.into(), Arc::new(CommandHandler::action()));
        h
    }

    /// Adds (or replaces) the handler of `topic`.
    pub fn insert(&mut self, topic: &str, handler: impl Handler) -> Result<(), GossipError> {
        check_topic(topic)?;
        self.by_topic.insert(topic.into(), Arc::new(handler));
        Ok(())
    }

    /// Removes the handler of `topic`, if any.
    pub fn remove(&mut self, topic: &str) {
        self.by_topic.remove(topic);
    }

    /// The handler of `topic`.
    pub fn get(&self, topic: &str) -> Option<Arc<dyn Handler>> {
        self.by_topic.get(topic).cloned()
    }

    /// The topics handled, in order.
    pub fn topics(&self) -> Vec<String> {
        self.by_topic.keys().cloned().collect()
    }
}

/// Store-backed mode: before running an action, the winner takes the election id as a
/// lease on a store and never gives it back, so a second winner (after a network split,
/// or a repeated id) finds it taken and does not run the action.
#[derive(Clone)]
pub struct Claim {
    /// The lease store.
    pub store: Arc<dyn LeaseStore>,
    /// How long a claim lasts; an id can run again only after this.
    pub ttl: Duration,
    /// Put before the election id to make the lease's election name (e.g. `gossip/`).
    pub prefix: String,
}

impl Claim {
    /// A claim on `store` lasting a day, under the prefix `gossip/`.
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self { store, ttl: Duration::from_secs(24 * 3600), prefix: "gossip/".into() }
    }

    /// Takes the election id for `job`: its fencing token, or why not.
    pub(crate) async fn take(&self, job: &Job, attempt: &str) -> Result<u64, String> {
        let name = ElectionName::new(format!("{}{}", self.prefix, job.election)).map_err(|e| e.to_string())?;
        // The worker id follows the holder-id rule and leaves room for the attempt.
        let holder = HolderId::new(format!("{}:{attempt}", job.worker)).map_err(|e| e.to_string())?;
        // The action, for whoever inspects the claim, cut to what a lease can carry.
        let mut end = job.action.len().min(MAX_METADATA);
        while !job.action.is_char_boundary(end) {
            end -= 1;
        }
        let req =
            AcquireRequest::new(name.clone(), holder, self.ttl).with_metadata(job.action.as_bytes()[..end].to_vec());
        match self.store.try_acquire(&req).await {
            Ok(Acquire::Acquired(rec)) => Ok(rec.token.0),
            Ok(Acquire::Held(rec)) => Err(format!(
                "election {} is already claimed on the store (lease {name} held by {}, token {}); not running it again",
                job.election, rec.holder, rec.token
            )),
            Err(e) => Err(format!("claiming election {} on the store failed, so it was not run: {e}", job.election)),
        }
    }
}
