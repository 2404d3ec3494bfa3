//! `tenure run`: a command that runs only while this process leads; the campaign settings,
//! the term's supervision and the shell commands held within a term, which
//! `tenure campaign` (campaign.rs) and `tenure schedule` (schedule.rs) share.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use anyhow::{Context, Result, bail};
use tenure::ledger::{Claim, Policy, Refusal, WorkEntry, WorkState};
use tenure::{CancellationToken, ElectionName, Elector, Leadership, LeaseStore, WorkKey};

use crate::proclaim::MetadataFile;
use crate::schedule::rfc3339;
use crate::term::{EXTEND_EVERY, Standby, Supervised, can_start, stop_at_ns};

/// How often a leading `tenure run` looks at `TENURE_METADATA_FILE`.
const METADATA_EVERY: Duration = Duration::from_millis(200);

/// Settings shared by `run` and `schedule`.
pub struct Campaign {
    pub election: String,
    pub id: Option<String>,
    pub ttl: Duration,
    pub grace: Duration,
    pub metadata: Option<String>,
    /// A health check that makes an unhealthy leader stand aside.
    pub health: Option<Health>,
    /// Where to serve the operator endpoints (`--http`).
    pub http: Option<std::net::SocketAddr>,
    /// How long a winner waits before its term is handed out (`--cool-down`).
    pub cool_down: Duration,
    /// The standby candidates' pause between tries (`--backoff`), if not the default.
    pub backoff: Option<Duration>,
    /// Whether this candidate publishes its presence (`--announce`).
    pub announce: bool,
    /// Its priority among announcing candidates (`--priority`).
    pub priority: i32,
    /// How many hold the election at once (`--holders`).
    pub holders: u32,
}

/// Docker's health-check settings: `cmd` runs every `interval` while leading; `retries`
/// failures or timeouts in a row make the leader stop its command, resign and stand
/// aside for one TTL.
#[derive(Clone)]
pub struct Health {
    pub cmd: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub retries: u32,
}

impl Health {
    /// Runs the check every interval until it fails `retries` times in a row; returns
    /// what the last failure was. Each result is published with the candidate's presence
    /// (with `--announce`), for `tenure status`.
    async fn watch(self, env: Vec<(&'static str, String)>, l: &Leadership, cgroup: Option<PathBuf>) -> String {
        let mut failures = 0;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // Woken past the deadline (frozen, stuck) before the term's end was seen: a check
            // now would act with the token of a term that is over. The end comes next.
            if !l.is_valid() {
                std::future::pending::<()>().await;
            }
            let checked = self.check(&env, cgroup.as_deref()).await;
            let health = if checked.is_ok() { tenure::Health::Passing } else { tenure::Health::Failing };
            if let Err(e) = l.set_health(health).await {
                tracing::debug!(error = %e, "could not publish the health check's result");
            }
            let failed = match checked {
                Ok(()) => {
                    failures = 0;
                    continue;
                }
                Err(why) => why,
            };
            failures += 1;
            tracing::warn!(failures, retries = self.retries, "health check failed: {failed}");
            if failures >= self.retries {
                return format!("{failures} health checks failed in a row, the last: {failed}");
            }
        }
    }

    /// One check: `sh -c CMD` in a process group of its own, killed whole on timeout.
    /// It runs within the term, with its token, so nothing of it outlives the check or
    /// `tenure run`: see [`InTerm`].
    async fn check(&self, env: &[(&'static str, String)], cgroup: Option<&Path>) -> Result<(), String> {
        run_sh(&self.cmd, env, self.timeout, "health command", InTerm { cgroup }).await
    }
}

impl Campaign {
    /// A campaign for `election` with every optional setting off.
    pub fn new(election: &str, ttl: Duration, grace: Duration) -> Self {
        Self {
            election: election.into(),
            id: None,
            ttl,
            grace,
            metadata: None,
            health: None,
            http: None,
            cool_down: Duration::ZERO,
            backoff: None,
            announce: false,
            priority: 0,
            holders: 1,
        }
    }

    /// Builds the elector and, with `--http`, starts serving the operator endpoints for
    /// it (the metrics recorder is installed first, so the elector reports to it).
    pub(crate) async fn start(&self, store: Arc<dyn LeaseStore>) -> Result<Elector> {
        let metrics = match self.http {
            Some(_) => Some(crate::http::install_recorder()?),
            None => None,
        };
        let elector = self.elector(store.clone())?;
        // One holder and several are different records in the store: a candidate of the
        // other kind would run beside them unseen, so it is refused here.
        // A store that fails for now (a failover, a restart) does not stop the campaign,
        // which retries on its own: the check is then skipped.
        match tenure::holders::check_holders(&*store, elector.election(), self.holders).await {
            Ok(Some(why)) => bail!("cannot campaign with --holders {}: {why}", self.holders),
            Ok(None) => {}
            Err(e) if !e.is_retryable() => {
                return Err(anyhow::Error::new(e).context(format!("cannot read {}", elector.election())));
            }
            Err(e) => tracing::warn!(election = %elector.election(), error = %e,
                "could not check whether candidates with another --holders hold the election; campaigning on"),
        }
        tokio::spawn(report_leaders(elector.events(), elector.holder().clone()));
        if let (Some(addr), Some(metrics)) = (self.http, metrics) {
            crate::http::serve(addr, metrics, elector.clone(), store).await?;
        }
        Ok(elector)
    }

    /// Builds the elector, stepping down early enough that the command can be
    /// stopped (SIGTERM, `grace`, SIGKILL) before the lease deadline.
    pub fn elector(&self, store: Arc<dyn LeaseStore>) -> Result<Elector> {
        if self.election.starts_with(tenure::RESERVED_PREFIX) {
            bail!(
                "cannot campaign for {}: names under {} are tenure's own (presence leases, the slots of \
                 elections with several holders)",
                self.election,
                tenure::RESERVED_PREFIX
            );
        }
        let renew_deadline = self.renew_deadline()?;
        let mut b = Elector::builder(store, &self.election).ttl(self.ttl).renew_deadline(renew_deadline);
        if let Some(id) = &self.id {
            if crate::term::mutant("id-shared-across-processes") {
                b = b.holder(id);
            } else {
                b = b.holder(tenure::HolderId::instance_of(id).map_err(|e| anyhow::anyhow!("invalid --id: {e}"))?);
            }
        }
        if let Some(m) = &self.metadata {
            b = b.metadata(m.as_bytes().to_vec());
        }
        b = b.cool_down(self.cool_down).announce(self.announce).priority(self.priority).holders(self.holders);
        if let Some(backoff) = self.backoff {
            b = b.retry_period(backoff);
        }
        b.build().map_err(|e| match e {
            tenure::BuildError::Config(c) => {
                let flag = match c.setting {
                    "cool_down" => "--cool-down",
                    "retry_period" => "--backoff",
                    "holders" => "--holders",
                    "priority" => "--priority",
                    other => other,
                };
                anyhow::anyhow!("invalid {flag}: {}", c.reason)
            }
            other => other.into(),
        })
    }

    /// Checks that `ttl` is valid and that `grace` fits inside it; returns when to step
    /// down (see [`crate::term::renew_deadline`]).
    pub fn renew_deadline(&self) -> Result<Duration> {
        crate::term::renew_deadline(self.ttl, self.grace)
    }
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn stop_on_signals() -> Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let stop = CancellationToken::new();
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let s = stop.clone();
    tokio::spawn(async move {
        // Stop first, then say so: writing the line can fail (a closed stderr), and the
        // stop must not depend on it.
        let why = tokio::select! {
            _ = int.recv() => "interrupted; stopping",
            _ = term.recv() => "terminated; stopping",
        };
        s.cancel();
        tracing::info!("{why}");
    });
    Ok(stop)
}

/// Writes `line` to standard output for a script reading it; one that has stopped reading
/// (a closed pipe) changes nothing: the campaign goes on, and stops and releases as it
/// would.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

pub(crate) fn child_env(l: &Leadership) -> Vec<(&'static str, String)> {
    vec![
        ("TENURE_ELECTION", l.election().to_string()),
        ("TENURE_TOKEN", l.token().to_string()),
        ("TENURE_HOLDER", l.holder().to_string()),
        ("TENURE_HOLDER_INDEX", l.holder_index().to_string()),
        ("TENURE_HOLDERS", l.holders().to_string()),
    ]
}

/// A command to run within a term, and how.
pub(crate) struct Job<'a> {
    /// The command and its arguments.
    argv: &'a [String],
    /// Its time between SIGTERM and SIGKILL.
    grace: Duration,
    /// A health check that makes the leader stand aside.
    health: Option<&'a Health>,
    /// The metadata it may publish (`TENURE_METADATA_FILE`), for `tenure run`.
    metadata: Option<&'a [u8]>,
    /// What its environment gets beyond the term's (`TENURE_ONCE_KEY`, `TENURE_SLOT`).
    pub(crate) env: Vec<(&'static str, String)>,
}

impl<'a> Job<'a> {
    pub(crate) fn new(argv: &'a [String], grace: Duration, health: Option<&'a Health>) -> Self {
        Self { argv, grace, health, metadata: None, env: Vec::new() }
    }

    /// The command's environment in the term `l`.
    fn env(&self, l: &Leadership) -> Vec<(&'static str, String)> {
        let mut env = child_env(l);
        env.extend(self.env.iter().cloned());
        env
    }
}

/// How a supervised command ended.
pub(crate) enum End {
    /// It exited on its own with this code.
    Exited(i32),
    /// Leadership ended; it was stopped.
    Lost,
    /// We were told to stop; it was stopped.
    Stopped,
    /// The health check failed too often; the command was stopped.
    Unhealthy,
    /// The standby supervisor ended before it started the command (it was killed, or
    /// stopped by someone else): nothing ran, and the term goes on.
    NotStarted,
}

/// Logs who leads, as this candidate (`me`) sees it, each time that changes: a waiting
/// replica says whom it waits for. A leader that was given this candidate's `--id` in
/// another process (a second process with the same id, or an earlier one that has not
/// released) is an error: each has an id of its own, so this one only waits, as a
/// follower, until that lease ends.
async fn report_leaders(mut events: tokio::sync::broadcast::Receiver<tenure::Event>, me: tenure::HolderId) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match events.recv().await {
            Ok(tenure::Event::LeaderChanged(Some(leader))) if leader.holder != me => {
                if me.instance_name().is_some_and(|n| leader.holder.instance_name() == Some(n)) {
                    let name = me.instance_name().unwrap_or_default();
                    tracing::error!(
                        leader = %leader.holder, token = leader.token.0, mine = %me,
                        "another process given --id {name} leads (a second process with this id, or an earlier one \
                         that has not released); ids must be unique per process: this one waits as a follower"
                    );
                } else {
                    tracing::info!(leader = %leader.holder, token = leader.token.0, "following: another candidate leads");
                }
            }
            Ok(tenure::Event::LeaderChanged(None)) => tracing::info!("nobody leads"),
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

/// Returns, with why, once `health` (if any) has failed too often during `l`; never
/// without a health check.
pub(crate) async fn unhealthy(health: Option<&Health>, l: &Leadership, cgroup: Option<PathBuf>) -> String {
    match health {
        Some(h) => h.clone().watch(child_env(l), l, cgroup).await,
        None => std::future::pending().await,
    }
}

/// Starts campaigning for `c`, with the signals that stop it and this process as the
/// subreaper of every command it starts.
pub(crate) async fn begin(store: Arc<dyn LeaseStore>, c: &Campaign) -> Result<(Elector, CancellationToken)> {
    let store_shown = store.describe();
    let elector = c.start(store).await?;
    let stop = stop_on_signals()?;
    crate::term::become_subreaper()?;
    tracing::info!(election = %elector.election(), holder = %elector.holder(), store = %store_shown, "campaigning");
    Ok((elector, stop))
}

/// How a wait for a term ended.
enum Next {
    /// This candidate leads.
    Term(Leadership),
    /// SIGINT or SIGTERM: the campaign has been shut down.
    Stopped,
    /// The wait was given up (`--no-wait`, `--wait-timeout`), for this reason; the
    /// campaign has been shut down.
    GaveUp(String),
}

/// How often a follower starts a standby supervisor in place of one that ended, at most:
/// each one that ends (killed, or its guard killed) is replaced, but one that cannot live
/// must not keep the host busy.
const STANDBY_REPLACED_EVERY: Duration = Duration::from_secs(1);

/// [`next_term`] for `tenure run`, which keeps `standby` ready meanwhile: a standby
/// that ends (killed, or its guard killed) is replaced, at most once every
/// [`STANDBY_REPLACED_EVERY`]; it is discarded before the campaign shuts down.
/// Waiting ends early when `give_up` answers.
async fn next_term_with_standby(
    elector: &Elector,
    stop: &CancellationToken,
    standby: &mut Option<Standby>,
    job: &Job<'_>,
    give_up: impl Future<Output = String>,
) -> Result<Next> {
    // When the next standby may start: one that ended is replaced then.
    let mut replace_at: Option<tokio::time::Instant> = None;
    let mut last_start: Option<tokio::time::Instant> = None;
    tokio::pin!(give_up);
    let gave_up = loop {
        let at = replace_at;
        let replace = async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stop.cancelled() => break None,
            l = elector.leadership() => return Ok(Next::Term(l?)),
            why = &mut give_up => break Some(why),
            _ = Standby::ended(standby) => {
                tracing::debug!("the standby supervisor ended");
                *standby = None;
                if last_start.is_some() && crate::term::mutant("standby-replaced-once") {
                    continue;
                }
                let now = tokio::time::Instant::now();
                replace_at = Some(last_start.map_or(now, |t| (t + STANDBY_REPLACED_EVERY).max(now)));
            }
            () = replace => {
                replace_at = None;
                last_start = Some(tokio::time::Instant::now());
                *standby = prepare_standby(job.argv, job.grace);
            }
        }
    };
    if let Some(s) = standby.take() {
        s.discard().await;
    }
    elector.shutdown().await;
    Ok(match gave_up {
        Some(why) => Next::GaveUp(why),
        None => Next::Stopped,
    })
}

/// The next term, or `None` once `stop` fired (the campaign is then shut down).
pub(crate) async fn next_term(elector: &Elector, stop: &CancellationToken) -> Result<Option<Leadership>> {
    tokio::select! {
        l = elector.leadership() => Ok(Some(l?)),
        _ = stop.cancelled() => {
            elector.shutdown().await;
            Ok(None)
        }
    }
}

/// How long a new leader waits for its standby supervisor to become ready, when the
/// term came sooner than the supervisor's start (the first term, at once): far more than
/// its start takes, which starting a supervisor afresh would take too.
const STANDBY_READY_WITHIN: Duration = Duration::from_millis(200);

/// How long a standby supervisor, told to start the command, may take to mark that it
/// has: far more than it takes (about a millisecond), so that only a frozen or stuck one
/// is replaced.
const STANDBY_START_WITHIN: Duration = Duration::from_secs(2);

/// A standby supervisor for `cmd`, or none if it cannot be started (the command is
/// then started the usual way, whose error, if any, is the one to report).
fn prepare_standby(cmd: &[String], grace: Duration) -> Option<Standby> {
    Standby::prepare(cmd, grace)
        .map_err(|e| tracing::debug!(error = format!("{e:#}"), "cannot start a standby supervisor"))
        .ok()
}

/// Starts `job` for `l`: through `standby` if it is ready, else through a new supervisor.
async fn start_command(l: &Leadership, job: &Job<'_>, standby: Option<Standby>) -> Result<(Supervised, bool)> {
    let env = job.env(l);
    if let Some(mut s) = standby {
        if s.ready(STANDBY_READY_WITHIN).await {
            match s.start(&env, stop_at_ns(l, job.grace), job.metadata).await {
                Ok(child) => return Ok((child, true)),
                Err(e) => {
                    tracing::debug!(error = format!("{e:#}"), "the standby supervisor could not start the command")
                }
            }
        } else {
            s.discard().await;
        }
    }
    Ok((Supervised::spawn(job.argv, &env, stop_at_ns(l, job.grace), job.grace, job.metadata)?, false))
}

/// Runs `job` while `l` holds, through `standby` if it can; stops it when the term ends
/// or `stop` fires.
pub(crate) async fn supervise(
    l: &Leadership,
    job: &Job<'_>,
    standby: Option<Standby>,
    stop: &CancellationToken,
) -> Result<End> {
    let grace = job.grace;
    let (mut child, prestarted) = start_command(l, job, standby).await?;
    let metadata = child.metadata_file().map(MetadataFile::at);
    let metadata = metadata.as_ref();
    let mut look_at_metadata = tokio::time::interval(METADATA_EVERY);
    // A proclamation in flight runs beside the loop, which must go on extending the
    // supervisor's deadline and reacting to the term's end meanwhile.
    let mut publishing: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>> = None;
    let unhealthy = unhealthy(job.health, l, child.cgroup());
    tokio::pin!(unhealthy);
    tracing::info!(token = %l.token(), pid = child.pid(), prestarted, "leading; started the command");
    // Tell the supervisor of every renewal, so that it stops the command on its own
    // only if this process stops renewing (frozen or stuck). The runtime steps down
    // SWITCH_SLACK before the supervisor's instant, so its last renewal reaches it in time.
    let mut deadline = l.deadline();
    let mut tick = tokio::time::interval(EXTEND_EVERY);
    // A standby told to start must have done so by then (it marks the start), or it is
    // frozen or stuck: the term would hold the election with nothing running.
    let start_due = tokio::time::sleep(STANDBY_START_WITHIN);
    tokio::pin!(start_due);
    let mut start_checked = !prestarted || crate::term::mutant("standby-start-unchecked");
    loop {
        tokio::select! {
            biased;
            () = &mut start_due, if !start_checked => {
                start_checked = true;
                if !child.command_started() {
                    tracing::warn!(
                        token = %l.token(), pid = child.pid(),
                        "the standby supervisor has not started the command {} after it was told to (frozen or \
                         stuck); stopping it and starting the command through a new one",
                        humantime::format_duration(STANDBY_START_WITHIN)
                    );
                    if !child.end_if_frozen_before_start().await {
                        child.stop(grace).await;
                    }
                    return Ok(End::NotStarted);
                }
            }
            code = child.exited() => {
                // Whether the term still held when the command's end was seen. What follows
                // (a sweep for orphans, the cgroup's removal) only cleans up: a term that
                // runs out meanwhile, on a loaded host, must not make finished work run again.
                let in_term = l.is_valid();
                child.clean_up().await;
                if prestarted
                    && !child.command_started()
                    && !child.stopped_by_supervisor()
                    && !crate::term::mutant("standby-end-is-command-exit")
                {
                    tracing::warn!(token = %l.token(), code, "the standby supervisor ended before it started the command");
                    return Ok(End::NotStarted);
                }
                if in_term && !child.stopped_by_supervisor() {
                    return Ok(End::Exited(code));
                }
                // The term is over (this process was frozen or stuck past it): the end of
                // the term, not of the work. Campaign again. Say how it ended: the
                // supervisor stopped the command at the deadline, or it ended without
                // stopping it (killed), and then the command's processes were stopped only
                // now (by the guard, or by the sweep of its orphans).
                if child.stopped_by_supervisor() {
                    tracing::warn!(token = %l.token(), "the command was stopped at the lease deadline");
                } else {
                    let late = tenure::Clock::now(&tenure::TokioClock).saturating_duration_since(l.deadline());
                    tracing::error!(
                        token = %l.token(), code,
                        "the command's supervisor ended without stopping the command while this process could not \
                         act (frozen or stuck); the term ended {} ago, and the command's processes are stopped now \
                         (the guard stops them at the deadline if both fail)",
                        humantime::format_duration(Duration::from_millis(late.as_millis() as u64))
                    );
                }
                return Ok(End::Lost);
            }
            _ = l.cancelled() => {
                tracing::warn!(token = %l.token(), "leadership ended; stopping the command");
                child.stop(grace).await;
                return Ok(End::Lost);
            }
            _ = stop.cancelled() => {
                child.stop(grace).await;
                return Ok(End::Stopped);
            }
            why = &mut unhealthy => {
                tracing::warn!(token = %l.token(), "{why}; stopping the command and standing aside for one TTL");
                child.stop(grace).await;
                return Ok(End::Unhealthy);
            }
            _ = look_at_metadata.tick(), if metadata.is_some() && publishing.is_none() => {
                publishing = metadata.map(|m| Box::pin(m.publish(l)) as _);
            }
            () = async { publishing.as_mut().expect("guarded").await }, if publishing.is_some() => publishing = None,
            _ = tick.tick() => {
                if l.deadline() != deadline && l.is_valid() {
                    deadline = l.deadline();
                    child.extend(stop_at_ns(l, grace));
                }
            }
        }
    }
}

/// How long `tenure run` waits for its first term.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wait {
    /// Give up as soon as another candidate is seen leading (`--no-wait`).
    pub no_wait: bool,
    /// Give up after this long without a term (`--wait-timeout`).
    pub timeout: Option<Duration>,
    /// The exit code of giving up (`--conflict-exit-code`, 75 by default: EX_TEMPFAIL).
    pub code: u8,
}

impl Wait {
    /// Answers, with why, once waiting for the first term should end; never if it should not.
    async fn give_up(
        self,
        mut events: tokio::sync::broadcast::Receiver<tenure::Event>,
        me: tenure::HolderId,
    ) -> String {
        let another = async {
            if !self.no_wait {
                return std::future::pending().await;
            }
            loop {
                match events.recv().await {
                    Ok(tenure::Event::LeaderChanged(Some(leader))) if leader.holder != me => {
                        return format!("{} leads (token {}) and --no-wait was given", leader.holder, leader.token);
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending().await,
                }
            }
        };
        let late = async {
            match self.timeout {
                Some(d) => {
                    tokio::time::sleep(d).await;
                    format!("no term within --wait-timeout {}", humantime::format_duration(d))
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            why = another => why,
            why = late => why,
        }
    }
}

/// `tenure run --once KEY`: the unit of work and how it runs.
pub struct OnceRun {
    /// The key (`TENURE_ONCE_KEY` in the command's environment).
    pub key: WorkKey,
    /// The guarantee, the attempts and how long the key is kept.
    pub policy: Policy,
}

/// What `tenure run` does beyond running the command while leading.
pub struct RunOptions {
    /// Campaign again after the command exits on its own (`--keep-going`).
    pub keep_going: bool,
    /// Run the command once for a key (`--once`).
    pub once: Option<OnceRun>,
    /// How long to wait for the first term.
    pub wait: Wait,
}

/// What [`claim_once`] found for a term.
enum OnceStep {
    /// Run the command: the term has claimed the key (run `attempt`).
    Run(u32),
    /// A run of the key finished before.
    Done(WorkEntry),
    /// The term ended before the key was claimed, or a later term has it.
    TermOver,
}

/// Claims `once`'s key for the term `l`; a key that will not run is an error.
async fn claim_once(store: &dyn LeaseStore, l: &Leadership, once: &OnceRun) -> Result<OnceStep> {
    let key = &once.key;
    let claimed = tenure::ledger::claim_in_term(store, l, key, &once.policy)
        .await
        .with_context(|| format!("cannot claim the unit of work {key}"))?;
    Ok(match claimed {
        None | Some(Claim::Refused(_, Refusal::LaterTerm)) => OnceStep::TermOver,
        Some(Claim::Done(entry)) => OnceStep::Done(entry),
        Some(Claim::Run { attempt, after }) => {
            if let Some(prev) = after {
                tracing::info!(
                    %key, attempt, token = %l.token(),
                    "running {key} again: its run under token {} ({}) {}",
                    prev.token, prev.holder,
                    if prev.state == WorkState::Failed { "failed" } else { "ended with its term" }
                );
            }
            OnceStep::Run(attempt)
        }
        Some(Claim::Refused(entry, why)) => bail!(
            "the unit of work {key} will not run: {why} (last: {} under token {} by {}, {} run(s) started)",
            entry.state,
            entry.token,
            entry.holder,
            entry.attempts
        ),
    })
}

/// Logs that `key` was done before, by whom and when.
fn already_done(key: &WorkKey, entry: &WorkEntry) {
    tracing::info!(
        %key,
        "{key} was done by {} (token {}) at {}; not running it",
        entry.holder,
        entry.token,
        rfc3339(entry.at)
    );
}

/// `tenure run`: returns the exit code.
pub async fn run(store: Arc<dyn LeaseStore>, c: &Campaign, r: &RunOptions, cmd: &[String]) -> Result<i32> {
    let election = ElectionName::new(&c.election)?;
    // A command that cannot start would win, exit 127, hand over and win again for ever:
    // said before campaigning instead.
    if let Some(program) = cmd.first()
        && let Err(why) = startable(program)
    {
        eprintln!("tenure: error: cannot run {program:?}: {why}");
        return Ok(127);
    }
    if r.once.is_some() && c.holders > 1 {
        bail!("--once runs a unit of work on one holder; it cannot be combined with --holders {}", c.holders);
    }
    if r.wait.no_wait && c.holders > 1 {
        bail!(
            "--no-wait gives up when another candidate leads; with --holders {} several do: use --wait-timeout",
            c.holders
        );
    }
    if let Some(once) = &r.once {
        // A key done already: nothing to campaign for. (A read that fails for now is asked
        // again, as a claim, when leading.)
        match tenure::ledger::read(&*store, &election, &once.key).await {
            Ok(Some(entry)) if entry.state == WorkState::Done => {
                already_done(&once.key, &entry);
                return Ok(0);
            }
            Err(e) if !e.is_retryable() => {
                return Err(anyhow::Error::new(e).context(format!("cannot read the unit of work {}", once.key)));
            }
            _ => {}
        }
    }
    let ledger = store.clone();
    let (elector, stop) = begin(store, c).await?;
    let events = elector.events();
    let metadata = c.metadata.as_deref().unwrap_or("").as_bytes();
    let mut job = Job { metadata: Some(metadata), ..Job::new(cmd, c.grace, c.health.as_ref()) };
    // A supervisor started while following, ready to start the command the moment a
    // term begins; none after one ended before it started the command, until a command
    // has run (whatever ends them would end the next ones too).
    let mut standby = None;
    let mut use_standby = true;
    // Waiting may be given up only before the command first started.
    let mut give_up = Some(Box::pin(r.wait.give_up(events, elector.holder().clone())));
    loop {
        if standby.is_none() && use_standby {
            standby = prepare_standby(cmd, c.grace);
        }
        let waiting = async {
            match give_up.as_mut() {
                Some(g) => g.await,
                None => std::future::pending().await,
            }
        };
        let l = match next_term_with_standby(&elector, &stop, &mut standby, &job, waiting).await? {
            Next::Term(l) => l,
            Next::Stopped => return Ok(0),
            Next::GaveUp(why) => {
                tracing::info!("giving up: {why}");
                return Ok(i32::from(r.wait.code));
            }
        };
        if !can_start(&l, c.grace) {
            // Too little of this term is left to stop the command in time: wait for the
            // next renewal, or for the term to end.
            tracing::debug!(remaining = ?l.remaining(), "too little of the term left to start the command");
            tokio::select! {
                _ = l.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                _ = stop.cancelled() => {}
            }
            continue;
        }
        if let Some(once) = &r.once {
            let step = match claim_once(&*ledger, &l, once).await {
                Ok(step) => step,
                Err(e) => {
                    drop(l);
                    discard(&mut standby).await;
                    elector.shutdown().await;
                    return Err(e);
                }
            };
            match step {
                OnceStep::Run(attempt) => {
                    job.env =
                        vec![("TENURE_ONCE_KEY", once.key.to_string()), ("TENURE_ONCE_ATTEMPT", attempt.to_string())];
                }
                OnceStep::Done(entry) => {
                    already_done(&once.key, &entry);
                    drop(l);
                    discard(&mut standby).await;
                    elector.shutdown().await;
                    return Ok(0);
                }
                OnceStep::TermOver => {
                    tokio::select! {
                        _ = l.cancelled() => {}
                        _ = stop.cancelled() => {}
                    }
                    continue;
                }
            }
        }
        give_up = None;
        let end = supervise(&l, &job, standby.take(), &stop).await?;
        use_standby = !matches!(end, End::NotStarted);
        match end {
            End::NotStarted => drop(l),
            End::Exited(code) if r.keep_going => {
                tracing::info!(code, "the command exited; handing over and campaigning again");
                l.resign().await;
            }
            End::Exited(code) => {
                if let Some(once) = &r.once {
                    record_once(&*ledger, &l, once, code).await;
                }
                tracing::info!(code, "the command exited; releasing the lease");
                drop(l);
                elector.shutdown().await;
                return Ok(code);
            }
            End::Lost => drop(l),
            End::Unhealthy => l.resign_for(c.ttl).await,
            End::Stopped => {
                drop(l);
                elector.shutdown().await;
                return Ok(0);
            }
        }
    }
}

/// Discards a standby supervisor kept ready, if any.
async fn discard(standby: &mut Option<Standby>) {
    if let Some(s) = standby.take() {
        s.discard().await;
    }
}

/// Records how the run of `once`'s key in the term `l` ended: done when the command
/// exited 0, failed (open for another attempt) otherwise.
pub(crate) async fn record_once(store: &dyn LeaseStore, l: &Leadership, once: &OnceRun, code: i32) {
    let key = &once.key;
    let (token, keep) = (l.token(), once.policy.keep);
    let ended = if code == 0 {
        tenure::ledger::in_term(l, || tenure::ledger::complete(store, l.election(), key, token, keep)).await
    } else {
        tenure::ledger::in_term(l, || tenure::ledger::fail(store, l.election(), key, token, keep)).await
    };
    match ended {
        Ok(Some(true)) if code == 0 => tracing::info!(%key, %token, "{key} is done"),
        Ok(Some(true)) => {
            tracing::info!(%key, %token, code, "the run of {key} failed; it stays open for another attempt")
        }
        Ok(Some(false) | None) => {
            tracing::warn!(%key, %token, "the term ended before the run's end was recorded: {key} runs again in a later term")
        }
        Err(e) => tracing::warn!(%key, %token, "cannot record the run's end: {:#}", anyhow::Error::new(e)),
    }
}

/// How a shell command that runs within a term (a health check, with the term's token) is
/// held, so that nothing of it outlives the term: it dies with `tenure run` (a
/// parent-death signal), its process group is killed once it returns or is given up on,
/// and it runs in the command's cgroup (where there is one), which the guard and the
/// supervisor kill whole when the term's processes must go.
pub(crate) struct InTerm<'a> {
    pub(crate) cgroup: Option<&'a Path>,
}

/// Kills a process group when dropped (a check given up on, or returned).
struct KillGroup(Option<rustix::process::Pid>);

impl Drop for KillGroup {
    fn drop(&mut self) {
        if let Some(pid) = self.0
            && !crate::term::mutant("health-leftovers-kept")
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// `sh -c CMD` with `env`, in a process group of its own that is killed whole if it takes
/// longer than `limit`; `what` names it in errors. It is held as `in_term` says.
pub(crate) async fn run_sh(
    cmd: &str,
    env: &[(&'static str, String)],
    limit: Duration,
    what: &str,
    in_term: InTerm<'_>,
) -> Result<(), String> {
    // With the descriptor limit tenure started with (it raises its own).
    let script = match crate::term::starting_descriptor_limit() {
        Some(soft) => format!("ulimit -S -n {soft} 2>/dev/null\n{cmd}"),
        None => cmd.to_string(),
    };
    // `sh` is started through `tenure __in-term`, which asks for the parent-death signal
    // and enters the command's cgroup before it becomes `sh`.
    let exe = crate::term::own_program().map_err(|e| format!("cannot start the {what}: {e}"))?;
    let mut command = tokio::process::Command::new(exe);
    command.arg("__in-term").arg(std::process::id().to_string());
    if let Some(cg) = in_term.cgroup {
        command.arg("--cgroup").arg(cg);
    }
    command
        .args(["--", "sh", "-c"])
        .arg(script)
        .env_remove(crate::term::STORE_ENV)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| format!("cannot start the {what}: {e}"))?;
    let _group = KillGroup(child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)));
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("the {what} {status}")),
        Ok(Err(e)) => Err(format!("cannot wait for the {what}: {e}")),
        Err(_) => {
            if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.wait().await;
            Err(format!("the {what} took longer than {}", humantime::format_duration(limit)))
        }
    }
}

/// Whether `program` names a file that can be started: a path with a `/` as it is, a bare
/// name through `PATH`, as the shell finds it.
fn startable(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let executable =
        |p: &std::path::Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        return match std::fs::metadata(program) {
            Err(e) => Err(format!("{e}")),
            Ok(m) if m.is_dir() => Err("it is a directory".into()),
            Ok(_) if !executable(std::path::Path::new(program)) => Err("it is not executable (chmod +x it)".into()),
            Ok(_) => Ok(()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|dir| executable(&dir.join(program))) {
        Ok(())
    } else {
        Err("no such command in PATH (127, command not found)".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::term::{KILL_MARGIN, default_grace, shortest_ttl};
    use tenure::Config;

    fn campaign(ttl: Duration, grace: Duration) -> Campaign {
        Campaign::new("e", ttl, grace)
    }

    #[test]
    fn the_default_grace_fits_every_ttl_and_is_three_seconds_from_ten() {
        for ms in [1000, 2000, 3000, 5000, 7000, 10_000, 60_000] {
            let ttl = Duration::from_millis(ms);
            let grace = default_grace(ttl);
            assert!(grace <= Duration::from_secs(3) && !grace.is_zero(), "{ttl:?}: {grace:?}");
            assert!(campaign(ttl, grace).renew_deadline().is_ok(), "the default {grace:?} does not fit {ttl:?}");
        }
        assert_eq!(default_grace(Duration::from_secs(10)), Duration::from_secs(3));
        assert_eq!(default_grace(Duration::from_secs(5)), Duration::from_millis(1442));
    }

    #[test]
    fn a_renewal_taken_at_the_last_instant_reaches_the_supervisor_before_its_switch() {
        for (ttl, grace) in [(2000, 300), (5000, 1000), (10_000, 3000), (1000, 100)] {
            let c = campaign(Duration::from_millis(ttl), Duration::from_millis(grace));
            let step_down = c.renew_deadline().unwrap();
            // The supervisor's switch, counted like the step-down from the renewal's send time.
            let switch = Config::new(c.ttl).deadline_offset() - c.grace - KILL_MARGIN;
            let delivery = EXTEND_EVERY + crate::term::CHECK_EVERY;
            assert!(
                switch >= step_down + delivery * 2,
                "TTL {ttl} ms: the runtime takes renewals until {step_down:?}, the supervisor stops the command at \
                 {switch:?}, and passing a renewal on takes up to {delivery:?}"
            );
            // And the switch still leaves the grace and the kill margin before the lease ends.
            assert!(switch + c.grace + KILL_MARGIN <= Config::new(c.ttl).deadline_offset());
        }
    }

    #[test]
    fn a_ttl_too_short_for_any_grace_names_the_shortest_that_works() {
        let ttl = Duration::from_millis(500);
        let err = campaign(ttl, default_grace(ttl)).renew_deadline().unwrap_err().to_string();
        let shortest = shortest_ttl();
        assert!(err.contains("too short") && err.contains(&humantime::format_duration(shortest).to_string()), "{err}");
        assert!(campaign(shortest, default_grace(shortest)).renew_deadline().is_ok(), "{shortest:?} works");
        let below = shortest - Duration::from_millis(10);
        assert!(campaign(below, default_grace(below)).renew_deadline().is_err(), "{below:?} does not");
    }

    #[test]
    fn a_grace_that_leaves_no_room_to_retry_renewals_is_refused() {
        let err = campaign(Duration::from_secs(10), Duration::from_secs(5)).renew_deadline().unwrap_err();
        assert!(err.to_string().contains("renewals need time to retry"), "{err}");
        assert!(campaign(Duration::from_secs(10), Duration::from_secs(4)).renew_deadline().is_ok());
    }
}
