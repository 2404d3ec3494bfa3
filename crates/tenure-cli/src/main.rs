//! `tenure`: run a command on exactly one of several replicas, and inspect elections.
// The arguments' doc comments are the command's help text (clap), where `[:PORT]` and
// the like mean "optional", not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use tenure::ElectionName;

mod bench;
mod campaign;
mod cron;
mod dashboard;
mod demo;
mod docs;
#[cfg(test)]
mod fuzz;
mod gossip;
mod http;
mod inspect;
mod proclaim;
mod run;
mod schedule;
mod store_url;
mod term;

const EXIT_CODES: &str = "\
Exit codes:
  0    success (for run: the command succeeded, or tenure was stopped by SIGINT/SIGTERM;
       with --once, also: KEY was done already)
  1    error (store unreachable, bad store URL, …); the whole error chain is printed;
       run --once: KEY will not run (its attempts are used up, or --at-most-once and a
       run of it may have started before)
  2    usage error (bad flag, bad election name, evict without --yes off a terminal)
  N    run: the command's own exit code; 128+S when it died of signal S
  75   run: gave up waiting (--no-wait, --wait-timeout); --conflict-exit-code sets it
  3, 4 gossip elect: the action was not started (3); no outcome in time (4)";

/// Leader election for replicas: run a command on exactly one of them.
#[derive(Parser)]
#[command(name = "tenure", version, after_help = format!("{EXIT_CODES}\n\nStore: --store URL or TENURE_STORE, one of:\n{}", store_url::forms()))]
struct Cli {
    /// Lease store URL, e.g. sqlite:/var/lib/app/tenure.db
    #[arg(long, global = true, env = "TENURE_STORE", value_name = "URL", hide_env_values = true)]
    store: Option<String>,
    /// A file whose first line is the lease store URL: the URL (and its password) is then
    /// in no process's command line or environment. The file must be the caller's and
    /// unreadable by others
    #[arg(long, global = true, env = "TENURE_STORE_FILE", value_name = "PATH", conflicts_with = "store")]
    store_file: Option<std::path::PathBuf>,
    /// More log output on stderr (-v debug, -vv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only warnings and errors on stderr
    #[arg(short, long, global = true)]
    quiet: bool,
    /// The log lines on stderr: text, or json (one object a line: timestamp, level,
    /// message and the fields, such as election, holder, token)
    #[arg(long, global = true, env = "TENURE_LOG_FORMAT", value_name = "FORMAT", default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// For people: one line of text each, coloured only on a terminal.
    Text,
    /// For machines: one JSON object a line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Campaign, and run a command only while this process leads
    #[command(after_help = "\
Examples:
  tenure run billing/nightly -- ./nightly-report.sh
  tenure run billing/nightly --once \"$(date +%F)\" -- ./nightly-report.sh   # cron on every host
  tenure run db/migrate --no-wait -- ./migrate.sh                        # like flock -n
  tenure run queue/sweeper --ttl 15s --grace 5s --keep-going -- python sweeper.py

While it leads, the command runs with TENURE_ELECTION, TENURE_TOKEN (the fencing
token: pass it to whatever the command writes to) and TENURE_HOLDER set. When
leadership ends, the command and every process it started get SIGTERM, then
SIGKILL after --grace, before the lease deadline. If tenure itself dies, even by SIGKILL, the
command dies with it. SIGINT/SIGTERM stop the command, release, and exit 0.")]
    Run(RunArgs),
    /// Show who leads an election
    #[command(after_help = "\
Examples:
  tenure status billing/nightly
  tenure status billing/nightly --json")]
    Status {
        /// The election
        #[arg(value_parser = election)]
        election: ElectionName,
        /// Print JSON: {\"election\":…, \"leader\": null | {\"holder\":…, \"token\":…, …}}
        #[arg(long)]
        json: bool,
    },
    /// List elections that have a leader
    #[command(after_help = "\
Examples:
  tenure list
  tenure list billing/ --json")]
    List {
        /// Only elections whose names start with this
        #[arg(default_value = "")]
        prefix: String,
        /// Print a JSON array of status objects
        #[arg(long)]
        json: bool,
    },
    /// Serve a live page of every election: leader, token, countdown, changes
    #[command(after_help = "\
Examples:
  tenure dashboard --http 127.0.0.1:8080
  tenure dashboard billing/ --http 127.0.0.1:8080

One page with no external assets, on that address only; it reads the store every
250 ms and updates itself (server-sent events). Click an election for its metadata and
the changes seen since the page opened. Nothing on it changes state.")]
    Dashboard {
        /// Only elections whose names start with this
        #[arg(default_value = "")]
        prefix: String,
        /// Where to serve the page, e.g. 127.0.0.1:8080
        #[arg(long, value_name = "ADDR")]
        http: std::net::SocketAddr,
    },
    /// Make the leader stand down
    #[command(after_help = "\
By default the evicted leader stops its command and releases; nobody else can
lead before that, or before its current term runs out, so two commands never
overlap. --now clears the lease at once: only for a leader known to be dead.
--to reserves the election for a named candidate (one started with --announce
or --priority) before evicting, waits until it leads, and says so.

Examples:
  tenure evict billing/nightly
  tenure evict billing/nightly --yes
  tenure evict billing/nightly --yes --to web-2
  tenure evict billing/nightly --yes --now")]
    Evict {
        /// The election
        #[arg(value_parser = election)]
        election: ElectionName,
        /// Do not ask for confirmation (required when not on a terminal)
        #[arg(long, short)]
        yes: bool,
        /// Clear the lease at once (the old leader may still be acting)
        #[arg(long)]
        now: bool,
        /// Hand over to this announcing candidate: the election is reserved for it, so
        /// that no other announcing candidate slips in, and evict waits until it leads
        #[arg(long, value_name = "HOLDER", value_parser = holder)]
        to: Option<tenure::HolderId>,
    },
    /// Print a line for every change of leader, until interrupted
    #[command(after_help = "\
Examples:
  tenure watch billing/nightly
  tenure watch billing/nightly --json | jq .leader.holder")]
    Watch {
        /// Print one JSON object per line: the time, and the election and leader as `status --json` prints them
        #[arg(long)]
        json: bool,
        /// The election
        #[arg(value_parser = election)]
        election: ElectionName,
    },
    /// Run a command at each tick, only on the replica that leads
    #[command(after_help = "\
Examples:
  tenure schedule reports/hourly --every 1h -- ./report.sh
  tenure schedule db/vacuum --cron \"0 3 * * *\" -- ./vacuum.sh

Slots of --every fall on multiples of the period since the Unix epoch, so every
replica names them alike; --cron takes five fields (minute hour day month weekday,
names like mon or jan allowed, and @hourly, @daily, …), evaluated in UTC. Each slot
runs once across the replicas, whatever the handovers and their clocks: it is a key of
the store's work ledger (as with run --once), and the command gets TENURE_SLOT (the
slot's time, seconds since the epoch). A slot whose leader died mid-run runs again
under the next leader; a slot due while nobody led, or while the previous run was
still going, runs late, up to --catch-up; older ones are given up. Every slot is
logged: run, run late, run again, skipped (done), not run, given up.")]
    Schedule(ScheduleArgs),
    /// Campaign without a command of its own, for a program that runs on every replica
    /// and asks (--http /is-leader) or is told (hooks) whether it leads
    #[command(after_help = "\
Examples:
  tenure campaign api/writer --http 127.0.0.1:9464
  tenure campaign api/writer --on-elected './promote.sh' --on-stepped-down './demote.sh'

Prints `elected TOKEN` and `stepped-down TOKEN` as terms begin and end. --on-elected runs
(sh -c) when a term begins, --on-stepped-down when it ends, each with TENURE_ELECTION,
TENURE_TOKEN and TENURE_HOLDER set; a hook still running at the end of its term is
stopped (SIGTERM, --grace, SIGKILL), and the stepped-down hook gets --grace to finish,
before the lease deadline when the term ends for lack of renewals (late, with a warning,
if tenure campaign itself was frozen through the deadline). A program that
asks and then acts can act after losing: it must pass TENURE_TOKEN (or the token from
/is-leader) to what it writes. See docs/operations.md.")]
    Campaign(CampaignCmdArgs),
    /// See tenure work in under a minute: candidates, a crash, a handover
    #[command(after_help = "\
Starts several `tenure run` processes on a temporary SQLite store, kills the
leader with SIGKILL, stops the next one gracefully, and prints how long each
takeover took.

Example:
  tenure demo --candidates 5")]
    Demo {
        /// How many candidates to start
        #[arg(long, default_value_t = 5)]
        candidates: usize,
        /// Lease TTL of the candidates
        #[arg(long, default_value = "2s", value_parser = duration)]
        ttl: Duration,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    #[command(after_help = "\
Examples:
  tenure completions bash > /etc/bash_completion.d/tenure
  tenure completions zsh > \"${fpath[1]}/_tenure\"
  tenure completions fish > ~/.config/fish/completions/tenure.fish")]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print the man page, or write one per command into a directory
    #[command(after_help = "\
Examples:
  tenure man | man -l -
  tenure man --dir /usr/local/share/man/man1   # tenure.1, tenure-run.1, …")]
    Man {
        /// Write tenure.1 and tenure-COMMAND.1 pages into this directory
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Measure speed and store load of elections on the store, with baselines
    #[command(after_help = "\
Runs the scenarios in one process against --store and prints a table (or --json):
round trip of the simplest read; uncontended acquire; graceful handover (a leader
resigns); crash takeover (a leader is cut off from the store); steady-state store
calls of E elections x C candidates, with watches and with a polling baseline
(watch hidden, as client-go-style electors poll); and many elections held by one
process, and the same elections contested by --processes processes (this program
started again). Elections are named bench/RANDOM/...; a NATS bucket must have --ttl as its
TTL, so point it at a bucket of its own.

Examples:
  tenure bench
  tenure --store redis://127.0.0.1:6379 bench --scenario rtt,acquire,handover --json
  tenure --store etcd://127.0.0.1:2379 bench --scenario scale --scale 10000 --ttl 10s")]
    Bench(bench::Settings),
    /// Elect one worker over a message broker (Redis, RabbitMQ) to run an action once
    #[command(after_help = "\
Workers that share a broker form a group; an election picks one live worker to run
an action (lowest Lamport clock, then worker id) and tells the initiator.

Guarantee: an action runs at most once per id (within the 10 min retention) through
worker crashes, frozen or stalled workers, broker restarts and outages, and joins; a
stalled or cut-off worker gives up what it was deciding, so an action may then not run
at all. A network split can run it once per side, unless every worker uses --claim
with one shared --store. See docs/gossip.md.

Examples:
  tenure gossip worker --broker redis://127.0.0.1:6379
  tenure gossip worker --broker amqp://guest:guest@127.0.0.1:5672/%2f --handler reindex=./reindex.sh
  tenure gossip elect report-2026-11-21 --action './report.sh' --broker redis://127.0.0.1:6379
  tenure gossip members --broker redis://127.0.0.1:6379

Exit codes of elect: 0 the winner started the action (or had, for a repeated id);
3 it did not run (no worker handles the topic, the handler failed, the claim was taken,
the id was used before for another action); 4 no outcome in time (no workers, or
workers answered but none reported: it may have run once, or not at all).")]
    Gossip {
        #[command(subcommand)]
        command: GossipCommand,
    },
}

/// What `tenure` runs for itself: never offered to users, so kept out of [`Cli`] (and so
/// out of `--help`, completions and man pages).
#[derive(Parser)]
#[command(name = "tenure")]
struct Internal {
    #[command(subcommand)]
    command: InternalCommand,
}

#[derive(Subcommand)]
enum InternalCommand {
    /// The supervisor of a `tenure run` command (see term/supervisor.rs).
    #[command(name = "__child")]
    Child {
        parent: i32,
        deadline_file: PathBuf,
        grace_ms: u64,
        /// Wait, ready, to be told to start the command (SIGUSR1).
        #[arg(long)]
        standby: bool,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// The guard beside a supervisor (see term/guard.rs).
    #[command(name = "__guard")]
    Guard { parent: i32, supervisor: i32, deadline_file: PathBuf, grace_ms: u64 },
    /// A shell command run within a term (a health check): see `term::in_term`.
    #[command(name = "__in-term")]
    InTerm {
        parent: i32,
        #[arg(long)]
        cgroup: Option<PathBuf>,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// The job `tenure demo` runs.
    #[command(name = "__demo-job")]
    DemoJob { dir: PathBuf },
}

#[derive(Subcommand)]
enum GossipCommand {
    /// Join the group and run the actions this worker wins, until SIGINT/SIGTERM
    #[command(after_help = "\
Prints `decided ID WINNER` for every election, `started ID` when this worker
started the action, and `rejoining: REASON` then `joined GROUP again` when it lost
the broker or was stalled. With --allow-command the built-in topic `command` runs the
action with `sh -c`; --handler TOPIC=CMD runs CMD for TOPIC with the action in
TENURE_GOSSIP_ACTION. With --allow-command, anyone who can publish on the broker group
can make the worker run any command: give such workers a broker (or group and
credentials) of their own.
On SIGINT/SIGTERM the worker finishes the elections under way, waits for the
actions it started (their output goes to stderr), and leaves; a second signal stops
it at once (exit 1). A worker that was frozen or cut off from the broker gives up
the elections under way and joins again. With --claim, the winner first takes the
election id as a lease on --store (required: a store all workers share, and every
worker must use it), so the action never runs twice even if the group splits; a winner
that dies after claiming keeps the id from running until --claim-ttl ends.")]
    Worker(gossip::WorkerArgs),
    /// Ask the group to elect one worker to run an action; print the winner
    Elect {
        /// The election id: at most one run per id (e.g. report-2026-11-21)
        #[arg(value_parser = election, required_unless_present = "from_file")]
        id: Option<ElectionName>,
        /// Ask every id in PATH (one per line; blank lines and lines starting with # are
        /// skipped; - reads standard input) at once, from this one process, with the same
        /// topic and action; prints one line per id as its outcome comes in
        #[arg(long, value_name = "PATH", conflicts_with = "id")]
        from_file: Option<std::path::PathBuf>,
        #[command(flatten)]
        broker: gossip::BrokerArgs,
        /// The topic, which picks the workers' handler
        #[arg(long, default_value = "command")]
        topic: String,
        /// The action: for the `command` topic, the shell command to run
        #[arg(long, default_value = "")]
        action: String,
        /// How long to wait for the outcome (a broker that is down and workers that are
        /// rejoining are waited for within it)
        #[arg(long, default_value = "10s", value_parser = positive_duration)]
        wait: Duration,
        /// Print the outcome as JSON
        #[arg(long)]
        json: bool,
    },
    /// List the live workers of the group
    Members {
        #[command(flatten)]
        broker: gossip::BrokerArgs,
        /// How long to collect answers
        #[arg(long, default_value = "1s", value_parser = duration)]
        wait: Duration,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct CampaignCmdArgs {
    #[command(flatten)]
    campaign: run::CampaignArgs,
    /// Shell command to run when this process is elected
    #[arg(long, value_name = "CMD")]
    on_elected: Option<String>,
    /// Shell command to run when its term ends (it gets --grace to finish)
    #[arg(long, value_name = "CMD")]
    on_stepped_down: Option<String>,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    campaign: run::CampaignArgs,
    /// When the command exits on its own, hand over and campaign again instead of exiting
    #[arg(long, conflicts_with = "once")]
    keep_going: bool,
    /// Run the command once for this unit of work (e.g. "$(date +%F)"), across every
    /// replica and every later start: if a run of KEY finished (the command exited 0)
    /// within --keep, exit 0 without running it. A run cut short by the end of its term
    /// (the leader died or lost its lease) runs again under the next leader, with a larger
    /// TENURE_TOKEN; a run that failed leaves KEY open for the next attempt. The command
    /// gets TENURE_ONCE_KEY and TENURE_ONCE_ATTEMPT
    #[arg(long, value_name = "KEY", value_parser = work_key)]
    once: Option<tenure::WorkKey>,
    /// With --once: never start KEY a second time, not even after a run cut short or
    /// failed (at most once instead of at least once)
    #[arg(long, requires = "once")]
    at_most_once: bool,
    /// With --once: how many runs of KEY may start in all, failed and cut-short ones
    /// included, before it is given up
    #[arg(
        long,
        value_name = "N",
        default_value_t = tenure::ledger::DEFAULT_ATTEMPTS,
        value_parser = clap::value_parser!(u32).range(1..),
        requires = "once",
        conflicts_with = "at_most_once"
    )]
    attempts: u32,
    /// With --once: how long KEY is remembered (a KEY done longer ago runs again)
    #[arg(long, value_name = "DUR", default_value = "7d", value_parser = duration, requires = "once")]
    keep: Duration,
    /// Give up at once if another replica leads (exit 75, or --conflict-exit-code)
    #[arg(long)]
    no_wait: bool,
    /// Give up if this replica does not lead within DUR (exit 75, or --conflict-exit-code)
    #[arg(long, value_name = "DUR", value_parser = duration)]
    wait_timeout: Option<Duration>,
    /// The exit code of giving up (--no-wait, --wait-timeout)
    #[arg(long, value_name = "N", default_value_t = 75)]
    conflict_exit_code: u8,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

impl RunArgs {
    /// What `tenure run` does beyond running the command while leading.
    fn options(&self) -> run::RunOptions {
        let guarantee = if self.at_most_once {
            tenure::ledger::Guarantee::AtMostOnce
        } else {
            tenure::ledger::Guarantee::AtLeastOnce
        };
        run::RunOptions {
            keep_going: self.keep_going,
            once: self.once.clone().map(|key| run::OnceRun {
                key,
                policy: tenure::ledger::Policy { guarantee, attempts: self.attempts, keep: self.keep },
            }),
            wait: run::Wait { no_wait: self.no_wait, timeout: self.wait_timeout, code: self.conflict_exit_code },
        }
    }
}

#[derive(Args)]
#[group(id = "when", required = true, args = ["every", "cron"])]
struct ScheduleArgs {
    #[command(flatten)]
    campaign: run::CampaignArgs,
    /// Run at every multiple of this period, e.g. 1m, 1h30m
    #[arg(long, value_parser = period)]
    every: Option<Duration>,
    /// Run at the times of this cron expression (UTC), e.g. "0 3 * * *"
    #[arg(long, value_parser = cron_expression)]
    cron: Option<cron::Cron>,
    /// How late a slot may still run, on the leader after a takeover or after a run that
    /// took longer than the period [default: one period, and at least two --ttl]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    catch_up: Option<Duration>,
    /// Never start a slot a second time, not even after a run cut short or failed
    #[arg(long)]
    at_most_once: bool,
    /// How many runs of one slot may start in all, failed and cut-short ones included
    #[arg(
        long,
        value_name = "N",
        default_value_t = tenure::ledger::DEFAULT_ATTEMPTS,
        value_parser = clap::value_parser!(u32).range(1..),
        conflicts_with = "at_most_once"
    )]
    attempts: u32,
    /// How long a slot is remembered as done (longer than --catch-up)
    #[arg(long, value_name = "DUR", default_value = "7d", value_parser = duration)]
    keep: Duration,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

fn election(s: &str) -> Result<ElectionName, String> {
    ElectionName::new(s).map_err(|e| e.to_string())
}

fn work_key(s: &str) -> Result<tenure::WorkKey, String> {
    tenure::WorkKey::new(s).map_err(|e| e.to_string())
}

fn holder(s: &str) -> Result<tenure::HolderId, String> {
    tenure::HolderId::new(s).map_err(|e| e.to_string())
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 10s, 1m30s)"))
}

/// A schedule's period: above zero.
fn period(s: &str) -> Result<Duration, String> {
    duration(s).and_then(|d| if d.is_zero() { Err("must be above zero".into()) } else { Ok(d) })
}

/// A cron expression (five fields, UTC).
fn cron_expression(s: &str) -> Result<cron::Cron, String> {
    cron::Cron::parse(s).map_err(|e| format!("{e:#}"))
}

/// A duration above zero and at most a day (a period or a time limit).
pub(crate) fn positive_duration(s: &str) -> Result<Duration, String> {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    duration(s).and_then(|d| match d {
        d if d.is_zero() => Err("must be above zero".into()),
        d if d > DAY => Err("must be at most a day (24h)".into()),
        d => Ok(d),
    })
}

fn init_logging(verbose: u8, quiet: bool, errors_only: bool, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let default = match (quiet, verbose) {
        _ if errors_only => "error",
        (true, _) => "warn",
        (false, 0) => "warn,tenure=info,tenure_cli=info,tenure_sqlite=info,tenure_gossip=info",
        (false, 1) => "info,tenure=debug,tenure_cli=debug,tenure_sqlite=debug,tenure_gossip=debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // A log line that cannot be written (stderr closed) is dropped: reporting that on
    // stderr would fail too, and nothing may stop on it.
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .log_internal_errors(false);
    match format {
        LogFormat::Text => fmt.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(false).with_ansi(false).init(),
    }
}

async fn dispatch(cli: Cli) -> Result<i32> {
    let from_file = cli.store_file.as_deref().map(store_url::read_store_file).transpose()?;
    let store = from_file.as_deref().or(cli.store.as_deref());
    match cli.command {
        Command::Completions { shell } => {
            // Into memory first: the generator panics where a write fails (a full disk).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tenure", &mut script);
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(&script).and_then(|()| out.flush()).context("cannot write the completion script")?;
            Ok(0)
        }
        Command::Man { dir } => docs::man(Cli::command(), dir.as_deref()).map(|()| 0),
        Command::Demo { candidates, ttl } => demo::demo(candidates, ttl).await.map(|()| 0),
        Command::Campaign(a) => {
            let c = a.campaign.campaign();
            let s = store_url::open(store).await?;
            campaign::campaign(s, &c, a.on_elected.as_deref(), a.on_stepped_down.as_deref()).await
        }
        Command::Run(a) => {
            let c = a.campaign.campaign();
            let options = a.options();
            let s = store_url::open(store).await?;
            run::run(s, &c, &options, &a.cmd).await
        }
        Command::Schedule(a) => {
            let schedule = match (a.every, &a.cron) {
                (Some(p), _) => cron::Schedule::Every(p),
                (None, Some(c)) => cron::Schedule::Cron(Box::new(c.clone())),
                (None, None) => anyhow::bail!("give --every or --cron"),
            };
            let c = a.campaign.campaign();
            let guarantee = if a.at_most_once {
                tenure::ledger::Guarantee::AtMostOnce
            } else {
                tenure::ledger::Guarantee::AtLeastOnce
            };
            let options = schedule::ScheduleOptions {
                catch_up: a.catch_up,
                policy: tenure::ledger::Policy { guarantee, attempts: a.attempts, keep: a.keep },
            };
            let s = store_url::open(store).await?;
            schedule::schedule(s, &c, &schedule, &options, &a.cmd).await
        }
        Command::Bench(mut settings) => {
            settings.store_url = store.map(str::to_string);
            match settings.contest_peer.clone() {
                Some(run) => bench::contest_peer(bench::Opener::new(|| store_url::open(store)), &settings, &run).await,
                None => bench::bench(bench::Opener::new(|| store_url::open(store)), &settings).await,
            }
        }
        #[cfg(feature = "gossip")]
        Command::Gossip { command } => match command {
            GossipCommand::Worker(args) => gossip::worker(args, store).await,
            GossipCommand::Elect { id, from_file, broker, topic, action, wait, json } => {
                let ids = match (id, from_file) {
                    (Some(id), _) => vec![id],
                    (None, Some(path)) => gossip::read_ids(&path)?,
                    (None, None) => unreachable!("clap requires an id or --from-file"),
                };
                gossip::elect(&broker.broker, &broker.group, &ids, &topic, &action, wait, json).await
            }
            GossipCommand::Members { broker, wait, json } => {
                gossip::members(&broker.broker, &broker.group, wait, json).await
            }
        },
        #[cfg(not(feature = "gossip"))]
        Command::Gossip { .. } => gossip::missing(),
        Command::Status { election, json } => {
            inspect::status(store_url::open(store).await?, &election, json).await.map(|()| 0)
        }
        Command::Dashboard { prefix, http } => dashboard::dashboard(store_url::open(store).await?, http, prefix).await,
        Command::List { prefix, json } => inspect::list(store_url::open(store).await?, &prefix, json).await.map(|()| 0),
        Command::Evict { election, yes, now, to } => {
            inspect::evict(store_url::open(store).await?, &election, yes, now, to).await
        }
        Command::Watch { election, json } => {
            inspect::watch(store_url::open(store).await?, &election, json).await.map(|()| 0)
        }
    }
}

async fn dispatch_internal(i: Internal) -> Result<i32> {
    match i.command {
        InternalCommand::Child { parent, deadline_file, grace_ms, standby, cmd } => {
            Ok(term::supervisor(parent, &deadline_file, Duration::from_millis(grace_ms), standby, &cmd).await)
        }
        InternalCommand::Guard { parent, supervisor, deadline_file, grace_ms } => {
            Ok(term::guard(parent, supervisor, &deadline_file, Duration::from_millis(grace_ms)))
        }
        InternalCommand::InTerm { parent, cgroup, cmd } => Ok(term::in_term(parent, cgroup.as_deref(), &cmd)),
        InternalCommand::DemoJob { dir } => demo::job(&dir).await,
    }
}

fn main() -> ExitCode {
    let internal = std::env::args_os().nth(1).is_some_and(|a| a.to_string_lossy().starts_with("__"));
    if internal {
        return block_on(dispatch_internal(Internal::parse()));
    }
    let cli = parse_cli();
    if matches!(cli.command, Command::Run(_) | Command::Campaign(_) | Command::Schedule(_) | Command::Dashboard { .. })
    {
        term::raise_descriptor_limit();
    }
    if !matches!(cli.command, Command::Completions { .. } | Command::Man { .. }) {
        // The benchmark cuts off its own candidates and stops hundreds of terms: the
        // warnings those faults cause are expected, not the user's. Only errors unless asked.
        let bench = matches!(cli.command, Command::Bench(_)) && cli.verbose == 0;
        init_logging(cli.verbose, cli.quiet, bench, cli.log_format);
    }
    block_on(dispatch(cli))
}

/// The command line, parsed; usage errors exit 2 (with a hint where one helps). Every
/// subcommand's help ends with the exit codes, as the top-level help does.
fn parse_cli() -> Cli {
    use clap::FromArgMatches;
    let command = Cli::command().mut_subcommands(|sc| {
        let help = match sc.get_after_help() {
            Some(h) => format!("{h}\n\n{EXIT_CODES}"),
            None => EXIT_CODES.to_string(),
        };
        sc.after_help(help)
    });
    let matches = command.try_get_matches().unwrap_or_else(|e| usage_error(e));
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| usage_error(e))
}

/// Prints a usage error and exits 2 (clap's own exit for help and version requests).
fn usage_error(e: clap::Error) -> ! {
    let runs_a_command = std::env::args().skip(1).any(|a| matches!(a.as_str(), "run" | "schedule"));
    if e.kind() == clap::error::ErrorKind::UnknownArgument && runs_a_command && !std::env::args().any(|a| a == "--") {
        let _ = e.print();
        eprintln!("\ntip: the command goes after --, as in: tenure run ELECTION -- ./report.sh ARGS…");
        std::process::exit(2);
    }
    e.exit()
}

/// An error and its causes, joined with ": ", each cause left out when the text before it
/// already says it (client libraries often repeat their source in their own message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let said = cause.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
    }
    text
}

/// Runs `work` and turns its outcome into the exit code, printing the whole error chain.
fn block_on(work: impl std::future::Future<Output = Result<i32>>) -> ExitCode {
    // One thread: a child's parent-death signal follows the thread that started it.
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tenure: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(work) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            // Not eprintln!, which panics (exit 101) when standard error cannot be written
            // either, e.g. both sent to a full disk: the exit code still says what happened.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "tenure: error: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}
