//! `tenure`: run a command on exactly one of several replicas, and inspect elections.
// The arguments' doc comments are the command's help text (clap), where `[:PORT]` and
// the like mean "optional", not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser};

#[cfg(feature = "gossip")]
use args::GossipCommand;
use args::{Cli, Command, Internal, InternalCommand, LogFormat};

mod args;
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
            Some(h) => format!("{h}\n\n{}", args::EXIT_CODES),
            None => args::EXIT_CODES.to_string(),
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
