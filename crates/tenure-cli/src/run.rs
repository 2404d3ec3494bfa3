//! `tenure run` and `tenure schedule`: a command that runs only while this process leads.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use tenure::{CancellationToken, Config, Elector, Leadership, LeaseStore};

use crate::child::{Standby, Supervised};
use crate::cron::Schedule;
use crate::proclaim::MetadataFile;

/// Time kept between killing the command and the lease deadline, for the kill itself.
const KILL_MARGIN: Duration = Duration::from_millis(200);

const _: () = assert!(crate::child::STOP_SLACK.as_millis() < KILL_MARGIN.as_millis());

/// How often `tenure run` passes a renewal on to the supervisor's deadline file.
const EXTEND_EVERY: Duration = Duration::from_millis(10);

/// How often a leading `tenure run` looks at `TENURE_METADATA_FILE`.
const METADATA_EVERY: Duration = Duration::from_millis(200);

/// How long before the supervisor's own stop instant the runtime stops taking renewals
/// (it steps down then). A renewal that lands at the last instant the runtime takes it
/// must still reach the supervisor before its switch fires: tenure run's tick, an atomic
/// file write and the supervisor's next read, twice over for a loaded host.
const SWITCH_SLACK: Duration = Duration::from_millis(2 * (10 + 20));
const _: () =
    assert!(SWITCH_SLACK.as_millis() >= 2 * (EXTEND_EVERY.as_millis() + crate::child::CHECK_EVERY.as_millis()));

/// The grace periods that fit `cfg`'s TTL lie below this: after the first renewal
/// attempt, at least two retries must fit before the step-down (or one slow answer would
/// end every term), and the step-down must leave the grace and the kill margin.
fn grace_budget(cfg: &Config) -> Duration {
    cfg.deadline_offset().saturating_sub(cfg.renew_interval + KILL_MARGIN + SWITCH_SLACK + cfg.retry_period * 2)
}

/// The grace period when none is given: 3 s, or for a TTL too short for that, three
/// quarters of the most that fits (in whole milliseconds).
pub fn default_grace(ttl: Duration) -> Duration {
    let budget = grace_budget(&Config::new(ttl));
    Duration::from_millis((budget.as_millis() as u64 * 3 / 4).max(1)).min(Duration::from_secs(3))
}

/// The flags of every command that campaigns (`run`, `campaign`, `schedule`), turned
/// into a [`Campaign`] by [`CampaignArgs::campaign`].
#[derive(clap::Args)]
pub struct CampaignArgs {
    /// The election, e.g. billing/nightly-report
    #[arg(value_parser = crate::election)]
    election: tenure::ElectionName,
    /// Holder id (default hostname.pid.random)
    #[arg(long)]
    id: Option<String>,
    /// Lease TTL: how long the lease outlives a leader that died
    #[arg(long, default_value = "10s", value_parser = crate::duration)]
    ttl: Duration,
    /// How long the command gets between SIGTERM and SIGKILL when leadership ends
    /// [default: 3s, or for a short --ttl three quarters of the most that fits: about 1.4s at 5s]
    #[arg(long, value_parser = crate::duration)]
    grace: Option<Duration>,
    /// Text published with the lease for observers (e.g. host:port), at most 4 KiB
    #[arg(long)]
    metadata: Option<String>,
    /// While leading, run this shell command every --health-interval (with the
    /// command's environment); after --health-retries failures or timeouts in a row,
    /// stop the command, resign, and stand aside for one TTL so that another replica leads
    #[arg(long, value_name = "CMD")]
    health_cmd: Option<String>,
    /// Time between health checks
    #[arg(long, default_value = "10s", value_parser = crate::duration)]
    health_interval: Duration,
    /// Longest a health check may take; a slower one counts as failed
    #[arg(long, default_value = "5s", value_parser = crate::duration)]
    health_timeout: Duration,
    /// Failed health checks in a row that make the leader stand aside
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    health_retries: u32,
    /// Serve /metrics (Prometheus), /healthz, /leader and /is-leader on this address
    /// only, e.g. 127.0.0.1:9464
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// After winning, wait this long (renewing meanwhile) before starting the command,
    /// so that a previous leader's last writes can land
    #[arg(long, value_name = "DUR", default_value = "0s", value_parser = crate::duration)]
    cool_down: Duration,
    /// How long a standby candidate waits between tries while another leads (on stores
    /// that cannot notify) and after a failed store call [default: TTL/10, at most 2s]
    #[arg(long, value_name = "DUR", value_parser = crate::duration)]
    backoff: Option<Duration>,
    /// Publish this candidate's presence (holder id and --metadata) so that `tenure
    /// status` lists it beside the leader; one more store call per TTL/3
    #[arg(long)]
    announce: bool,
    /// This candidate's priority (implies --announce): a leader of lower priority that
    /// also announces hands over to it gracefully (its command stopped within --grace,
    /// then the lease released and reserved for this one); equal priorities never
    /// preempt each other [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,
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
            health: self.health_cmd.clone().map(|cmd| Health {
                cmd,
                interval: self.health_interval,
                timeout: self.health_timeout,
                retries: self.health_retries,
            }),
        }
    }
}

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
    async fn watch(self, env: Vec<(&'static str, String)>, l: &Leadership) -> String {
        let mut failures = 0;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + self.interval, self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let checked = self.check(&env).await;
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
    async fn check(&self, env: &[(&'static str, String)]) -> Result<(), String> {
        run_sh(&self.cmd, env, self.timeout, "health command").await
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
        }
    }

    /// Builds the elector and, with `--http`, starts serving the operator endpoints for
    /// it (the metrics recorder is installed first, so the elector reports to it).
    async fn start(&self, store: Arc<dyn LeaseStore>) -> Result<Elector> {
        let metrics = match self.http {
            Some(_) => Some(crate::http::install_recorder()?),
            None => None,
        };
        let elector = self.elector(store.clone())?;
        if let (Some(addr), Some(metrics)) = (self.http, metrics) {
            crate::http::serve(addr, metrics, elector.clone(), store).await?;
        }
        Ok(elector)
    }

    /// Builds the elector, stepping down early enough that the command can be
    /// stopped (SIGTERM, `grace`, SIGKILL) before the lease deadline.
    pub fn elector(&self, store: Arc<dyn LeaseStore>) -> Result<Elector> {
        let renew_deadline = self.renew_deadline()?;
        let mut b = Elector::builder(store, &self.election).ttl(self.ttl).renew_deadline(renew_deadline);
        if let Some(id) = &self.id {
            b = b.holder(id);
        }
        if let Some(m) = &self.metadata {
            b = b.metadata(m.as_bytes().to_vec());
        }
        b = b.cool_down(self.cool_down).announce(self.announce).priority(self.priority);
        if let Some(backoff) = self.backoff {
            b = b.retry_period(backoff);
        }
        b.build().map_err(|e| match e {
            tenure::BuildError::Config(c) => {
                let flag = match c.setting {
                    "cool_down" => "--cool-down",
                    "retry_period" => "--backoff",
                    other => other,
                };
                anyhow::anyhow!("invalid {flag}: {}", c.reason)
            }
            other => other.into(),
        })
    }

    /// Checks that `ttl` is valid and that `grace` fits inside it; returns when to step down.
    pub fn renew_deadline(&self) -> Result<Duration> {
        let cfg = Config::new(self.ttl);
        if let Err(e) = cfg.validate() {
            bail!("invalid --ttl {}: {}", humantime::format_duration(self.ttl), e.reason);
        }
        let budget = grace_budget(&cfg);
        if self.grace.is_zero() || self.grace >= budget {
            bail!(
                "--grace {} does not fit inside --ttl {}: the command must be stopped before the lease \
                 runs out, and renewals need time to retry, so --grace must be above zero and below {} for this TTL \
                 (or choose a longer --ttl)",
                humantime::format_duration(self.grace),
                humantime::format_duration(self.ttl),
                humantime::format_duration(Duration::from_millis(budget.as_millis() as u64)),
            );
        }
        Ok(cfg.deadline_offset() - self.grace - KILL_MARGIN - SWITCH_SLACK)
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
        tokio::select! {
            _ = int.recv() => tracing::info!("interrupted; stopping"),
            _ = term.recv() => tracing::info!("terminated; stopping"),
        }
        s.cancel();
    });
    Ok(stop)
}

fn child_env(l: &Leadership) -> Vec<(&'static str, String)> {
    vec![
        ("TENURE_ELECTION", l.election().to_string()),
        ("TENURE_TOKEN", l.token().to_string()),
        ("TENURE_HOLDER", l.holder().to_string()),
    ]
}

/// How a supervised command ended.
enum End {
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

/// The instant (ns on the host's boot-time clock) by which the command must start
/// stopping: the local deadline less the grace period and the kill margin.
fn stop_at_ns(l: &Leadership, grace: Duration) -> u64 {
    let left = l.remaining().saturating_sub(grace + KILL_MARGIN);
    crate::child::boottime_ns() + left.as_nanos() as u64
}

/// Whether `l` has time left to start the command and still stop it (SIGTERM, `grace`,
/// SIGKILL) before the lease deadline. A term handed out late (this process was frozen
/// between the renewal and now) must not start work it cannot stop in time.
fn can_start(l: &Leadership, grace: Duration) -> bool {
    l.remaining() > grace + KILL_MARGIN + MIN_RUN
}

/// The least time a command gets before its supervisor must start stopping it.
const MIN_RUN: Duration = Duration::from_millis(100);

/// Returns, with why, once `health` (if any) has failed too often during `l`; never
/// without a health check.
async fn unhealthy(health: Option<&Health>, l: &Leadership) -> String {
    match health {
        Some(h) => h.clone().watch(child_env(l), l).await,
        None => std::future::pending().await,
    }
}

/// Starts campaigning for `c`, with the signals that stop it and this process as the
/// subreaper of every command it starts.
async fn begin(store: Arc<dyn LeaseStore>, c: &Campaign) -> Result<(Elector, CancellationToken)> {
    let elector = c.start(store).await?;
    let stop = stop_on_signals()?;
    crate::child::become_subreaper()?;
    tracing::info!(election = %elector.election(), holder = %elector.holder(), "campaigning");
    Ok((elector, stop))
}

/// [`next_term`] for `tenure run`, which keeps `standby` ready meanwhile: a standby
/// that ends (killed) is replaced once; it is discarded before the campaign shuts down.
async fn next_term_with_standby(
    elector: &Elector,
    stop: &CancellationToken,
    standby: &mut Option<Standby>,
    cmd: &[String],
    grace: Duration,
) -> Result<Option<Leadership>> {
    let mut replaced = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            l = elector.leadership() => return Ok(Some(l?)),
            _ = Standby::ended(standby) => {
                tracing::debug!("the standby supervisor ended");
                *standby = None;
                if !replaced {
                    replaced = true;
                    *standby = prepare_standby(cmd, grace);
                }
            }
        }
    }
    if let Some(s) = standby.take() {
        s.discard().await;
    }
    elector.shutdown().await;
    Ok(None)
}

/// The next term, or `None` once `stop` fired (the campaign is then shut down).
async fn next_term(elector: &Elector, stop: &CancellationToken) -> Result<Option<Leadership>> {
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

/// A standby supervisor for `cmd`, or none if it cannot be started (the command is
/// then started the usual way, whose error, if any, is the one to report).
fn prepare_standby(cmd: &[String], grace: Duration) -> Option<Standby> {
    Standby::prepare(cmd, grace)
        .map_err(|e| tracing::debug!(error = format!("{e:#}"), "cannot start a standby supervisor"))
        .ok()
}

/// Starts `cmd` for `l`: through `standby` if it is ready, else through a new supervisor.
async fn start_command(
    l: &Leadership,
    cmd: &[String],
    grace: Duration,
    metadata: Option<&[u8]>,
    standby: Option<Standby>,
) -> Result<(Supervised, bool)> {
    if let Some(mut s) = standby {
        if s.ready(STANDBY_READY_WITHIN).await {
            match s.start(&child_env(l), stop_at_ns(l, grace), metadata).await {
                Ok(child) => return Ok((child, true)),
                Err(e) => {
                    tracing::debug!(error = format!("{e:#}"), "the standby supervisor could not start the command")
                }
            }
        } else {
            s.discard().await;
        }
    }
    Ok((Supervised::spawn(cmd, &child_env(l), stop_at_ns(l, grace), grace, metadata)?, false))
}

/// Runs `cmd` while `l` holds, through `standby` if it can; stops it when the term ends
/// or `stop` fires.
async fn supervise(
    l: &Leadership,
    cmd: &[String],
    grace: Duration,
    health: Option<&Health>,
    metadata: Option<&[u8]>,
    standby: Option<Standby>,
    stop: &CancellationToken,
) -> Result<End> {
    let (mut child, prestarted) = start_command(l, cmd, grace, metadata, standby).await?;
    let metadata = child.metadata_file().map(MetadataFile::at);
    let metadata = metadata.as_ref();
    let mut look_at_metadata = tokio::time::interval(METADATA_EVERY);
    // A proclamation in flight runs beside the loop, which must go on extending the
    // supervisor's deadline and reacting to the term's end meanwhile.
    let mut publishing: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>> = None;
    let unhealthy = unhealthy(health, l);
    tokio::pin!(unhealthy);
    tracing::info!(token = %l.token(), pid = child.pid(), prestarted, "leading; started the command");
    // Tell the supervisor of every renewal, so that it stops the command on its own
    // only if this process stops renewing (frozen or stuck). The runtime steps down
    // SWITCH_SLACK before the supervisor's instant, so its last renewal reaches it in time.
    let mut deadline = l.deadline();
    let mut tick = tokio::time::interval(EXTEND_EVERY);
    loop {
        tokio::select! {
            biased;
            code = child.wait() => {
                if prestarted
                    && !child.command_started()
                    && !child.stopped_by_supervisor()
                    && !crate::child::mutant("standby-end-is-command-exit")
                {
                    tracing::warn!(token = %l.token(), code, "the standby supervisor ended before it started the command");
                    return Ok(End::NotStarted);
                }
                if l.is_valid() && !child.stopped_by_supervisor() {
                    return Ok(End::Exited(code));
                }
                // The supervisor stopped it because this process did not extend the deadline
                // in time (it was frozen or stuck), or it ended after the lease ran out:
                // either way this is the end of the term, not of the work. Campaign again.
                tracing::warn!(token = %l.token(), "the command was stopped at the lease deadline");
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

/// `tenure run`: returns the exit code.
pub async fn run(store: Arc<dyn LeaseStore>, c: &Campaign, keep_going: bool, cmd: &[String]) -> Result<i32> {
    let (elector, stop) = begin(store, c).await?;
    // A supervisor started while following, ready to start the command the moment a
    // term begins; none after one ended before it started the command, until a command
    // has run (whatever ends them would end the next ones too).
    let mut standby = None;
    let mut use_standby = true;
    loop {
        if standby.is_none() && use_standby {
            standby = prepare_standby(cmd, c.grace);
        }
        let Some(l) = next_term_with_standby(&elector, &stop, &mut standby, cmd, c.grace).await? else {
            return Ok(0);
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
        let metadata = c.metadata.as_deref().unwrap_or("").as_bytes();
        let end = supervise(&l, cmd, c.grace, c.health.as_ref(), Some(metadata), standby.take(), &stop).await?;
        use_standby = !matches!(end, End::NotStarted);
        match end {
            End::NotStarted => drop(l),
            End::Exited(code) if keep_going => {
                tracing::info!(code, "the command exited; handing over and campaigning again");
                l.resign().await;
            }
            End::Exited(code) => {
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

/// `tenure campaign`: leads without a command of its own, running the hooks as terms
/// begin and end; returns on a signal.
pub async fn campaign(
    store: Arc<dyn LeaseStore>,
    c: &Campaign,
    on_elected: Option<&str>,
    on_stepped_down: Option<&str>,
) -> Result<i32> {
    let (elector, stop) = begin(store, c).await?;
    loop {
        let Some(l) = next_term(&elector, &stop).await? else { return Ok(0) };
        println!("elected {}", l.token());
        let mut end = match on_elected {
            // The hook runs inside the term like tenure run's command: stopped if the term
            // ends first. Its finishing is not the end of the term.
            Some(hook) if can_start(&l, c.grace) => {
                let hook = ["sh".to_string(), "-c".to_string(), hook.to_string()];
                match supervise(&l, &hook, c.grace, c.health.as_ref(), None, None, &stop).await? {
                    End::Exited(code) if code != 0 => {
                        tracing::warn!(code, "the on-elected hook failed; leading on");
                        None
                    }
                    End::Exited(_) => None,
                    other => Some(other),
                }
            }
            _ => None,
        };
        if end.is_none() {
            end = Some(tokio::select! {
                _ = l.cancelled() => End::Lost,
                _ = stop.cancelled() => End::Stopped,
                why = unhealthy(c.health.as_ref(), &l) => {
                    tracing::warn!(token = %l.token(), "{why}; standing aside for one TTL");
                    End::Unhealthy
                }
            });
        }
        // The term is over (or ending): tell the program before the lease goes.
        println!("stepped-down {}", l.token());
        if let Some(hook) = on_stepped_down {
            run_hook(hook, &child_env(&l), c.grace).await;
        }
        match end {
            Some(End::Stopped) => {
                drop(l);
                elector.shutdown().await;
                return Ok(0);
            }
            Some(End::Unhealthy) => l.resign_for(c.ttl).await,
            _ => drop(l),
        }
    }
}

/// Runs a hook (`sh -c`) with `env`, in a process group of its own that is killed whole
/// if it takes longer than `limit`.
async fn run_hook(hook: &str, env: &[(&'static str, String)], limit: Duration) {
    if let Err(why) = run_sh(hook, env, limit, "on-stepped-down hook").await {
        tracing::warn!("{why}");
    }
}

/// `sh -c CMD` with `env`, in a process group of its own that is killed whole if it takes
/// longer than `limit`; `what` names it in errors.
async fn run_sh(cmd: &str, env: &[(&'static str, String)], limit: Duration, what: &str) -> Result<(), String> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start the {what}: {e}"))?;
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

/// `tenure schedule`: runs `cmd` at each tick of `schedule` while leading; returns on a signal.
pub async fn schedule(store: Arc<dyn LeaseStore>, c: &Campaign, schedule: &Schedule, cmd: &[String]) -> Result<i32> {
    let elector = c.start(store).await?;
    let stop = stop_on_signals()?;
    crate::child::become_subreaper()?;
    elector.start();
    tracing::info!(election = %elector.election(), holder = %elector.holder(), %schedule, "campaigning; running the command at each tick while leading");
    let mut next = schedule.next_after(SystemTime::now());
    loop {
        let Some(at) = next else {
            tracing::warn!("the schedule has no further ticks");
            elector.shutdown().await;
            return Ok(0);
        };
        let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => {
                elector.shutdown().await;
                return Ok(0);
            }
        }
        if SystemTime::now() < at {
            continue; // woke early (the wall clock moved); wait again
        }
        match elector.current().filter(|l| can_start(l, c.grace)) {
            Some(l) => {
                tracing::info!(tick = %humantime::format_rfc3339_seconds(at), "tick");
                let end = supervise(&l, cmd, c.grace, c.health.as_ref(), None, None, &stop).await?;
                if matches!(end, End::Unhealthy) {
                    l.resign_for(c.ttl).await;
                } else {
                    drop(l);
                }
                if let End::Exited(code) = end {
                    tracing::info!(code, "the command finished");
                }
                if matches!(end, End::Stopped) {
                    elector.shutdown().await;
                    return Ok(0);
                }
            }
            None => tracing::debug!("tick: not leading"),
        }
        let now = SystemTime::now();
        let following = schedule.next_after(at);
        next = schedule.next_after(now.max(at));
        if following.is_some() && following < next {
            tracing::warn!("ticks passed while the command was still running; they were skipped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let delivery = EXTEND_EVERY + crate::child::CHECK_EVERY;
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
    fn a_grace_that_leaves_no_room_to_retry_renewals_is_refused() {
        let err = campaign(Duration::from_secs(10), Duration::from_secs(5)).renew_deadline().unwrap_err();
        assert!(err.to_string().contains("renewals need time to retry"), "{err}");
        assert!(campaign(Duration::from_secs(10), Duration::from_secs(4)).renew_deadline().is_ok());
    }
}
