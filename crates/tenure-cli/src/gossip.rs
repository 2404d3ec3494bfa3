//! `tenure gossip`: elections over a message broker, one action on exactly one live worker.

use std::time::Duration;

use crate::args::duration;
#[cfg(feature = "gossip")]
use crate::store_url;
use anyhow::Result;
#[cfg(feature = "gossip")]
use anyhow::{Context, bail};
use clap::Args;
#[cfg(feature = "gossip")]
use tenure_gossip::{Claim, Client, CommandHandler, Config, Event, GossipError, Handlers, Worker};

/// Exit code of `elect` when the winner did not start the action.
#[cfg(feature = "gossip")]
pub const EXIT_NOT_STARTED: i32 = 3;
/// Exit code of `elect` when no outcome came in time.
#[cfg(feature = "gossip")]
pub const EXIT_NO_OUTCOME: i32 = 4;

/// Where the group is.
#[derive(Args)]
pub struct BrokerArgs {
    /// Broker URL: redis://[:PASSWORD@]HOST[:PORT] or amqp://USER:PASSWORD@HOST[:PORT]/VHOST
    #[arg(long, env = "TENURE_BROKER", value_name = "URL", hide_env_values = true)]
    pub broker: String,
    /// The group: workers of one group elect among themselves
    #[arg(long, default_value = "default")]
    pub group: String,
}

/// The settings of `tenure gossip worker`.
#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Worker id (default hostname.pid); unique in the group
    #[arg(long)]
    pub id: Option<String>,
    /// Run CMD (with sh -c) for elections of TOPIC; repeatable
    #[arg(long = "handler", value_name = "TOPIC=CMD")]
    pub handlers: Vec<String>,
    /// Handle the built-in `command` topic: run any action with `sh -c`. Off by default:
    /// with it, anyone who can publish on the broker group can run commands here
    #[arg(long)]
    pub allow_command: bool,
    /// The default now (the `command` topic is off unless --allow-command); accepted so
    /// that older scripts still start
    #[arg(long, hide = true, conflicts_with = "allow_command")]
    pub no_command: bool,
    /// How often the worker says it is alive
    #[arg(long, default_value = "2s", value_parser = crate::args::positive_duration)]
    pub heartbeat: Duration,
    /// Silence after which a worker is lost (default: 2.5 heartbeats; at least 2)
    #[arg(long, value_parser = crate::args::positive_duration)]
    pub lost_after: Option<Duration>,
    /// How long an election waits for a silent member before it waits only for live ones
    #[arg(long, default_value = "2s", value_parser = crate::args::positive_duration)]
    pub election_timeout: Duration,
    /// Claim each won election id on --store before running it
    #[arg(long)]
    pub claim: bool,
    /// How long a claim keeps an id from running again
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub claim_ttl: Duration,
}

#[cfg(feature = "gossip")]
/// `tenure gossip worker`: joins the group and runs won actions until SIGINT/SIGTERM,
/// then leaves cleanly. Prints one line per decision on stdout.
pub async fn worker(s: WorkerArgs, store: Option<&str>) -> Result<i32> {
    let mut handlers = if s.allow_command { Handlers::with_command() } else { Handlers::new() };
    for h in &s.handlers {
        let Some((topic, cmd)) = h.split_once('=') else {
            bail!("--handler {h:?}: write TOPIC=COMMAND, e.g. --handler reindex=./reindex.sh");
        };
        if cmd.trim().is_empty() {
            bail!("--handler {h:?}: the command is empty");
        }
        handlers.insert(topic, CommandHandler::fixed(cmd)).with_context(|| format!("--handler {h:?}"))?;
    }
    let mut config = Config { heartbeat: s.heartbeat, election_timeout: s.election_timeout, ..Config::default() };
    config.lost_after = s.lost_after.unwrap_or(s.heartbeat.saturating_mul(5) / 2);
    if let Some(id) = s.id {
        config.id = id;
    }
    let claim = if s.claim {
        if store.is_none() {
            bail!(
                "--claim needs --store URL (or TENURE_STORE) naming a store every worker shares; \
                 a SQLite file of each machine's own would not stop a split from running an action twice"
            );
        }
        if !(tenure::store::MIN_TTL..=tenure::store::MAX_TTL).contains(&s.claim_ttl) {
            bail!(
                "--claim-ttl {:?} must lie between {:?} and {:?}",
                s.claim_ttl,
                tenure::store::MIN_TTL,
                tenure::store::MAX_TTL
            );
        }
        Some(Claim { ttl: s.claim_ttl, ..Claim::new(store_url::open(store).await?) })
    } else {
        None
    };
    let (broker, group) = (&s.broker.broker, &s.broker.group);
    let transport = tenure_gossip::connect(broker, group)?;
    let stop = crate::run::stop_on_signals()?;
    let topics = handlers.topics();
    let mut worker = Worker::start(transport.clone(), config, handlers, claim)
        .await
        .with_context(|| format!("cannot join group {group:?} on {}", transport.describe()))?;
    let mut events = worker.events();
    println!("joined {group} as {} (topics: {})", worker.id(), topics.join(", "));
    let mut first_join = true;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            e = events.recv() => match e {
                Ok(Event::Joined { .. }) if first_join => first_join = false,
                Ok(Event::Joined { .. }) => println!("joined {group} again"),
                Ok(Event::LinkLost) => println!("rejoining: lost the broker connection"),
                Ok(Event::Rejoining { reason }) => println!("rejoining: {reason}"),
                Ok(Event::Decided(d)) => println!("decided {} {}", d.election, d.winner.as_deref().unwrap_or("-")),
                Ok(Event::Started { election }) => println!("started {election}"),
                Ok(Event::NotStarted { election, error }) => println!("not-started {election}: {error}"),
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "events came faster than they could be printed")
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    return worker.wait().await.map(|()| 0).context("the worker stopped");
                }
            },
        }
    }
    // A second signal stops at once, without waiting for elections or actions.
    let again = crate::run::stop_on_signals()?;
    tokio::select! {
        r = worker.shutdown() => r.context("leaving the group")?,
        _ = again.cancelled() => {
            eprintln!("tenure: second signal: stopping without waiting for elections or running actions");
            return Ok(1);
        }
    }
    Ok(0)
}

#[cfg(feature = "gossip")]
/// The election ids of `--from-file PATH` (`-`: standard input): one per line, blank lines
/// and `#` comments skipped; a line that is not an election name is an error naming it.
pub fn read_ids(path: &std::path::Path) -> Result<Vec<tenure::ElectionName>> {
    use std::io::Read;
    let (name, file): (String, Box<dyn Read>) = if path.as_os_str() == "-" {
        ("standard input".into(), Box::new(std::io::stdin()))
    } else {
        let f = std::fs::File::open(path)
            .with_context(|| format!("cannot read the election ids from {}", path.display()))?;
        (path.display().to_string(), Box::new(f))
    };
    let mut text = String::new();
    file.take(MAX_IDS_FILE + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the election ids from {name}"))?;
    if text.len() as u64 > MAX_IDS_FILE {
        bail!("{name} holds more than {} MiB of election ids; split it", MAX_IDS_FILE >> 20);
    }
    let mut ids = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let id = tenure::ElectionName::new(line)
            .with_context(|| format!("{name}, line {}: {line:?} is not an election id", n + 1))?;
        if !seen.insert(id.clone()) {
            eprintln!("tenure: warning: {name}, line {}: {id} is named twice; asked once", n + 1);
            continue;
        }
        ids.push(id);
    }
    if ids.is_empty() {
        bail!("{name} names no election id");
    }
    Ok(ids)
}

#[cfg(feature = "gossip")]
/// The most `--from-file` reads (16 MiB).
const MAX_IDS_FILE: u64 = 16 << 20;

#[cfg(feature = "gossip")]
/// How many elections `tenure gossip elect --from-file` has under way at once: each one's
/// messages (a request, an answer from every worker, the outcome) pass through the
/// client's buffer of 4,096, which this leaves room in for groups of up to 60 workers.
const ELECT_AT_ONCE: usize = 64;

#[cfg(feature = "gossip")]
/// `tenure gossip elect`: asks the group to elect a worker for each of `ids` (all at once,
/// from one connection, at most 64 at a time) and prints each winner as its outcome comes in. Exits 0 if every
/// action started, [`EXIT_NO_OUTCOME`] if any election had no outcome, else
/// [`EXIT_NOT_STARTED`] if any did not start.
pub async fn elect(
    broker: &str,
    group: &str,
    ids: &[tenure::ElectionName],
    topic: &str,
    action: &str,
    wait: Duration,
    json: bool,
) -> Result<i32> {
    if topic == tenure_gossip::COMMAND_TOPIC && action.trim().is_empty() {
        bail!("the {topic:?} topic needs --action: the command for the winner to run");
    }
    let transport = tenure_gossip::connect(broker, group)?;
    let client = match Client::connect(transport.clone()).await {
        Ok(c) => c,
        Err(e) => {
            // A broker restarting: the election is asked once it is back, within --wait.
            eprintln!(
                "tenure: warning: {:#}; trying again until --wait ({}) runs out",
                anyhow::Error::from(e),
                humantime::format_duration(wait)
            );
            Client::new(transport)
        }
    };
    // Each election a task of its own, at most ELECT_AT_ONCE at a time, printed as each ends.
    let client = std::sync::Arc::new(client);
    let (topic_owned, action_owned) = (std::sync::Arc::<str>::from(topic), std::sync::Arc::<str>::from(action));
    let mut waiting = ids.iter().map(|id| id.as_str().to_string());
    let mut running = tokio::task::JoinSet::new();
    let (mut no_outcome, mut not_started, mut failed) = (false, false, 0);
    loop {
        while running.len() < ELECT_AT_ONCE
            && let Some(id) = waiting.next()
        {
            let (client, topic, action) = (client.clone(), topic_owned.clone(), action_owned.clone());
            running.spawn(async move {
                let outcome = client.elect(&id, &topic, &action, wait).await;
                (id, outcome)
            });
        }
        let Some(done) = running.join_next().await else { break };
        let (id, outcome) = done.context("an election's task ended abnormally")?;
        match report(&id, topic, outcome, json) {
            Ok(0) => {}
            Ok(EXIT_NO_OUTCOME) => no_outcome = true,
            Ok(_) => not_started = true,
            Err(e) if ids.len() == 1 => return Err(e),
            Err(e) => {
                eprintln!("tenure: error: {id}: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} elections could not be asked (each error is above)", ids.len());
    }
    Ok(if no_outcome {
        EXIT_NO_OUTCOME
    } else if not_started {
        EXIT_NOT_STARTED
    } else {
        0
    })
}

#[cfg(feature = "gossip")]
/// Prints the outcome of election `id` and answers its exit code.
fn report(id: &str, topic: &str, outcome: Result<tenure_gossip::Outcome, GossipError>, json: bool) -> Result<i32> {
    let outcome = match outcome {
        Ok(o) => o,
        Err(e @ (GossipError::NoWorkers { .. } | GossipError::NoOutcome { .. })) => {
            eprintln!("tenure: error: {e}");
            return Ok(EXIT_NO_OUTCOME);
        }
        Err(e @ GossipError::IdInUse { .. }) => {
            eprintln!("tenure: error: {e}");
            return Ok(EXIT_NOT_STARTED);
        }
        Err(e) => return Err(e.into()),
    };
    let mut outcome = outcome;
    if topic == tenure_gossip::COMMAND_TOPIC
        && let Some(e) = &mut outcome.error
        && e.contains("no live worker has a handler")
    {
        e.push_str(
            "; workers run the built-in \"command\" topic only when started with --allow-command \
             (or name a topic with --topic that their --handler serves)",
        );
    }
    if json {
        println!("{}", crate::inspect::json_line(&serde_json::to_value(&outcome)?));
    } else {
        let winner = outcome.winner.as_deref().unwrap_or("-");
        let repeat = if outcome.repeat { " (decided before; not run again)" } else { "" };
        match (&outcome.error, outcome.started) {
            (None, true) => println!("{winner} started {id}{repeat}"),
            (Some(e), _) => println!("{winner} did not start {id}{repeat}: {e}"),
            (None, false) => println!("{winner} did not start {id}{repeat}"),
        }
    }
    Ok(if outcome.started { 0 } else { EXIT_NOT_STARTED })
}

#[cfg(feature = "gossip")]
/// `tenure gossip members`: lists the live workers of the group.
pub async fn members(broker: &str, group: &str, wait: Duration, json: bool) -> Result<i32> {
    let transport = tenure_gossip::connect(broker, group)?;
    let client = Client::connect(transport).await?;
    let members = client.members(wait).await?;
    if json {
        println!("{}", crate::inspect::json_line(&serde_json::to_value(&members)?));
    } else if members.is_empty() {
        println!("no live workers in group {group}");
    } else {
        for m in &members {
            println!("{}\tclock {}", m.id, m.clock);
        }
    }
    Ok(0)
}

/// Without the `gossip` feature: every `tenure gossip` command says so.
#[cfg(not(feature = "gossip"))]
pub fn missing() -> Result<i32> {
    Err(crate::store_url::missing("`tenure gossip`", "gossip"))
}
