//! The command line as clap reads it: every subcommand's flags and their help, the value
//! parsers, and the settings derived from the flags ([`CampaignArgs::campaign`],
//! [`RunArgs::options`]). `tenure gossip` and `tenure bench` keep their own flags beside
//! their code (gossip.rs, bench/mod.rs).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tenure::ElectionName;

use crate::run::{Campaign, Health};
use crate::term::default_grace;
use crate::{bench, cron, gossip};

pub(crate) const EXIT_CODES: &str = "\
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
#[command(name = "tenure", version, after_help = format!("{EXIT_CODES}\n\nStore: --store URL or TENURE_STORE, one of:\n{}", crate::store_url::forms()))]
pub(crate) struct Cli {
    /// Lease store URL, e.g. sqlite:/var/lib/app/tenure.db
    #[arg(long, global = true, env = "TENURE_STORE", value_name = "URL", hide_env_values = true)]
    pub(crate) store: Option<String>,
    /// A file whose first line is the lease store URL: the URL (and its password) is then
    /// in no process's command line or environment. The file must be the caller's and
    /// unreadable by others
    #[arg(long, global = true, env = "TENURE_STORE_FILE", value_name = "PATH", conflicts_with = "store")]
    pub(crate) store_file: Option<std::path::PathBuf>,
    /// More log output on stderr (-v debug, -vv trace); RUST_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Only warnings and errors on stderr
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// The log lines on stderr: text, or json (one object a line: timestamp, level,
    /// message and the fields, such as election, holder, token)
    #[arg(long, global = true, env = "TENURE_LOG_FORMAT", value_name = "FORMAT", default_value = "text")]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// For people: one line of text each, coloured only on a terminal.
    Text,
    /// For machines: one JSON object a line.
    Json,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct Internal {
    #[command(subcommand)]
    pub(crate) command: InternalCommand,
}

#[derive(Subcommand)]
pub(crate) enum InternalCommand {
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
pub(crate) enum GossipCommand {
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
pub(crate) struct CampaignCmdArgs {
    #[command(flatten)]
    pub(crate) campaign: CampaignArgs,
    /// Shell command to run when this process is elected
    #[arg(long, value_name = "CMD")]
    pub(crate) on_elected: Option<String>,
    /// Shell command to run when its term ends (it gets --grace to finish)
    #[arg(long, value_name = "CMD")]
    pub(crate) on_stepped_down: Option<String>,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) campaign: CampaignArgs,
    /// When the command exits on its own, hand over and campaign again instead of exiting
    #[arg(long, conflicts_with = "once")]
    pub(crate) keep_going: bool,
    /// Run the command once for this unit of work (e.g. "$(date +%F)"), across every
    /// replica and every later start: if a run of KEY finished (the command exited 0)
    /// within --keep, exit 0 without running it. A run cut short by the end of its term
    /// (the leader died or lost its lease) runs again under the next leader, with a larger
    /// TENURE_TOKEN; a run that failed leaves KEY open for the next attempt. The command
    /// gets TENURE_ONCE_KEY and TENURE_ONCE_ATTEMPT
    #[arg(long, value_name = "KEY", value_parser = work_key)]
    pub(crate) once: Option<tenure::WorkKey>,
    /// With --once: never start KEY a second time, not even after a run cut short or
    /// failed (at most once instead of at least once)
    #[arg(long, requires = "once")]
    pub(crate) at_most_once: bool,
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
    pub(crate) attempts: u32,
    /// With --once: how long KEY is remembered (a KEY done longer ago runs again)
    #[arg(long, value_name = "DUR", default_value = "7d", value_parser = duration, requires = "once")]
    pub(crate) keep: Duration,
    /// Give up at once if another replica leads (exit 75, or --conflict-exit-code)
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Give up if this replica does not lead within DUR (exit 75, or --conflict-exit-code)
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub(crate) wait_timeout: Option<Duration>,
    /// The exit code of giving up (--no-wait, --wait-timeout)
    #[arg(long, value_name = "N", default_value_t = 75)]
    pub(crate) conflict_exit_code: u8,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) cmd: Vec<String>,
}

impl RunArgs {
    /// What `tenure run` does beyond running the command while leading.
    pub(crate) fn options(&self) -> crate::run::RunOptions {
        let guarantee = if self.at_most_once {
            tenure::ledger::Guarantee::AtMostOnce
        } else {
            tenure::ledger::Guarantee::AtLeastOnce
        };
        crate::run::RunOptions {
            keep_going: self.keep_going,
            once: self.once.clone().map(|key| crate::run::OnceRun {
                key,
                policy: tenure::ledger::Policy { guarantee, attempts: self.attempts, keep: self.keep },
            }),
            wait: crate::run::Wait { no_wait: self.no_wait, timeout: self.wait_timeout, code: self.conflict_exit_code },
        }
    }
}

#[derive(Args)]
#[group(id = "when", required = true, args = ["every", "cron"])]
pub(crate) struct ScheduleArgs {
    #[command(flatten)]
    pub(crate) campaign: CampaignArgs,
    /// Run at every multiple of this period, e.g. 1m, 1h30m
    #[arg(long, value_parser = period)]
    pub(crate) every: Option<Duration>,
    /// Run at the times of this cron expression (UTC), e.g. "0 3 * * *"
    #[arg(long, value_parser = cron_expression)]
    pub(crate) cron: Option<cron::Cron>,
    /// How late a slot may still run, on the leader after a takeover or after a run that
    /// took longer than the period [default: one period, and at least two --ttl]
    #[arg(long, value_name = "DUR", value_parser = duration)]
    pub(crate) catch_up: Option<Duration>,
    /// Never start a slot a second time, not even after a run cut short or failed
    #[arg(long)]
    pub(crate) at_most_once: bool,
    /// How many runs of one slot may start in all, failed and cut-short ones included
    #[arg(
        long,
        value_name = "N",
        default_value_t = tenure::ledger::DEFAULT_ATTEMPTS,
        value_parser = clap::value_parser!(u32).range(1..),
        conflicts_with = "at_most_once"
    )]
    pub(crate) attempts: u32,
    /// How long a slot is remembered as done (longer than --catch-up)
    #[arg(long, value_name = "DUR", default_value = "7d", value_parser = duration)]
    pub(crate) keep: Duration,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) cmd: Vec<String>,
}

pub(crate) fn election(s: &str) -> Result<ElectionName, String> {
    ElectionName::new(s).map_err(|e| e.to_string())
}

pub(crate) fn work_key(s: &str) -> Result<tenure::WorkKey, String> {
    tenure::WorkKey::new(s).map_err(|e| e.to_string())
}

pub(crate) fn holder(s: &str) -> Result<tenure::HolderId, String> {
    tenure::HolderId::new(s).map_err(|e| e.to_string())
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 500ms, 10s, 1m30s)"))
}

/// A schedule's period: above zero.
pub(crate) fn period(s: &str) -> Result<Duration, String> {
    duration(s).and_then(|d| if d.is_zero() { Err("must be above zero".into()) } else { Ok(d) })
}

/// A cron expression (five fields, UTC).
pub(crate) fn cron_expression(s: &str) -> Result<cron::Cron, String> {
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

/// The flags of every command that campaigns (`run`, `campaign`, `schedule`), turned
/// into a [`Campaign`] by [`CampaignArgs::campaign`].
#[derive(clap::Args)]
pub struct CampaignArgs {
    /// The election, e.g. billing/nightly-report
    #[arg(value_parser = crate::args::election)]
    pub(crate) election: tenure::ElectionName,
    /// This candidate's name, to which each process adds '.' and 8 random characters for
    /// its holder id (default hostname.pid.random)
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) id: Option<String>,
    /// Lease TTL: how long the lease outlives a leader that died
    #[arg(long, default_value = "10s", value_parser = crate::args::duration)]
    pub(crate) ttl: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when leadership ends
    /// [default: 3s, or for a short --ttl three quarters of the most that fits: about 1.4s at 5s]
    #[arg(long, value_parser = crate::args::duration)]
    pub(crate) grace: Option<Duration>,
    /// Text published with the lease for observers (e.g. host:port), at most 4 KiB
    #[arg(long)]
    pub(crate) metadata: Option<String>,
    /// While leading, run this shell command every --health-interval (with the
    /// command's environment); after --health-retries failures or timeouts in a row,
    /// stop the command, resign, and stand aside for one TTL so that another replica leads
    #[arg(long, value_name = "CMD")]
    pub(crate) health_cmd: Option<String>,
    /// Time between health checks
    #[arg(long, default_value = "10s", value_parser = crate::args::positive_duration)]
    pub(crate) health_interval: Duration,
    /// Longest a health check may take; a slower one counts as failed
    #[arg(long, default_value = "5s", value_parser = crate::args::positive_duration)]
    pub(crate) health_timeout: Duration,
    /// Failed health checks in a row that make the leader stand aside
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) health_retries: u32,
    /// Serve /metrics (Prometheus), /healthz, /leader and /is-leader on this address
    /// only, e.g. 127.0.0.1:9464
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// After winning, wait this long (renewing meanwhile) before starting the command,
    /// so that a previous leader's last writes can land
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = crate::args::duration)]
    pub(crate) cool_down: Duration,
    /// How long a standby candidate waits between tries while another leads (on stores
    /// that cannot notify) and after a failed store call [default: TTL/10, at most 2s]
    #[arg(long, value_name = "DUR", value_parser = crate::args::duration)]
    pub(crate) backoff: Option<Duration>,
    /// Publish this candidate's presence (holder id and --metadata) so that `tenure
    /// status` lists it beside the leader; one more store call per TTL/3
    #[arg(long)]
    pub(crate) announce: bool,
    /// This candidate's priority (implies --announce): a leader of lower priority that
    /// also announces hands over to it gracefully (its command stopped within --grace,
    /// then the lease released and reserved for this one); equal priorities never
    /// preempt each other [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub(crate) priority: Option<i32>,
    /// How many candidates hold the election and run the command at once (up to 1000),
    /// each with a fencing token of its own, TENURE_HOLDER_INDEX (0 to N-1) and
    /// TENURE_HOLDERS; start every candidate of an election with the same N (one holder and
    /// several are refused beside each other; while candidates of different N > 1 run, up
    /// to the largest N hold)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) holders: u32,
}

impl CampaignArgs {
    /// The campaign these flags describe.
    pub fn campaign(&self) -> Campaign {
        Campaign {
            election: self.election.to_string(),
            id: self.id.clone(),
            ttl: self.ttl,
            grace: self.grace.unwrap_or_else(|| default_grace(self.ttl)),
            metadata: self.metadata.clone(),
            http: self.http,
            cool_down: self.cool_down,
            backoff: self.backoff,
            announce: self.announce || self.priority.is_some(),
            priority: self.priority.unwrap_or(0),
            holders: self.holders,
            health: self.health_cmd.clone().map(|cmd| Health {
                cmd,
                interval: self.health_interval,
                timeout: self.health_timeout,
                retries: self.health_retries,
            }),
        }
    }
}
