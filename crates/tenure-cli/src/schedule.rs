//! `tenure schedule`: each slot of a cron schedule run once, by whichever candidate leads
//! when it comes, and late after a takeover within `--catch-up`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use tenure::ledger::{Claim, Policy, Refusal, WorkState};
use tenure::{CancellationToken, ElectionName, Leadership, LeaseStore, WorkKey};

use crate::cron::Schedule;
use crate::run::{Campaign, End, Job, OnceRun, record_once, stop_on_signals, supervise};
use crate::term::can_start;

/// `tenure schedule`'s settings beyond the schedule itself.
pub struct ScheduleOptions {
    /// How late a slot may still run (`--catch-up`); `None`: [`default_catch_up`].
    pub catch_up: Option<Duration>,
    /// How slots are run: the guarantee, the attempts, how long a slot is kept.
    pub policy: Policy,
}

/// How late a slot may run by default: at least one period and at least two TTLs, so
/// that a takeover (within a TTL of a crash) never loses a slot.
pub fn default_catch_up(schedule: &Schedule, ttl: Duration) -> Duration {
    let now = SystemTime::now();
    let period = schedule
        .next_after(now)
        .and_then(|a| Some((a, schedule.next_after(a)?)))
        .and_then(|(a, b)| b.duration_since(a).ok())
        .unwrap_or_default();
    period.max(ttl.saturating_mul(2))
}

/// The work key of the slot at `at`.
fn slot_key(at: SystemTime) -> WorkKey {
    let ms = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    WorkKey::new(format!("slot-{ms}")).expect("a slot key is a valid work key")
}

/// How many slots one look back may find; older ones are given up.
const MAX_SLOTS_AT_ONCE: usize = 1000;

/// The slots of `schedule` in `(after, until]`, oldest first, at most
/// [`MAX_SLOTS_AT_ONCE`] (the latest ones).
fn slots_between(schedule: &Schedule, after: SystemTime, until: SystemTime) -> Vec<SystemTime> {
    let mut out = std::collections::VecDeque::new();
    let mut t = after;
    while let Some(next) = schedule.next_after(t).filter(|n| *n <= until) {
        if out.len() == MAX_SLOTS_AT_ONCE {
            out.pop_front();
        }
        out.push_back(next);
        t = next;
    }
    out.into()
}

/// `t` to the second, or a note that it cannot be shown (a ledger entry's time from a
/// hostile or corrupted store may lie past year 9999).
pub(crate) fn rfc3339(t: SystemTime) -> String {
    crate::inspect::rfc3339(t, false).unwrap_or_else(|| "(a time out of range)".into())
}

/// `tenure schedule`: runs `cmd` once for each slot of `schedule`, on whichever replica
/// leads when the slot is due (or, after a takeover, late, within the catch-up); returns
/// on a signal.
///
/// Each slot is a key of the work ledger, so that a slot whose run finished never runs
/// again whatever the handovers and the replicas' clocks, a slot whose leader died mid-run
/// runs again under the next leader, and a slot due while nobody led runs late.
pub async fn schedule(
    store: Arc<dyn LeaseStore>,
    c: &Campaign,
    schedule: &Schedule,
    opts: &ScheduleOptions,
    cmd: &[String],
) -> Result<i32> {
    if c.holders > 1 {
        bail!("schedule runs each slot on one holder; it cannot be combined with --holders {}", c.holders);
    }
    let catch_up = opts.catch_up.unwrap_or_else(|| default_catch_up(schedule, c.ttl));
    if catch_up >= opts.policy.keep {
        bail!(
            "--catch-up {} must be shorter than --keep {}: a slot forgotten while it may still run would run again",
            humantime::format_duration(catch_up),
            humantime::format_duration(opts.policy.keep)
        );
    }
    let ledger = store.clone();
    let store_shown = store.describe();
    let elector = c.start(store).await?;
    let stop = stop_on_signals()?;
    crate::term::become_subreaper()?;
    elector.start();
    tracing::info!(
        election = %elector.election(), holder = %elector.holder(), store = %store_shown, %schedule,
        catch_up = %humantime::format_duration(catch_up),
        "campaigning; running the command once for each slot while leading"
    );
    // Every slot up to `handled` has been dealt with by this process: run, found done or
    // refused, or given up. At first none has: slots due before this process started run
    // late if they fall within the catch-up and nobody ran them.
    let started = SystemTime::now();
    let mut handled = std::time::UNIX_EPOCH;
    loop {
        let l = tokio::select! {
            l = elector.leadership() => l?,
            _ = stop.cancelled() => {
                elector.shutdown().await;
                return Ok(0);
            }
        };
        let seen = Seen { started, handled: &mut handled };
        match run_due_slots(&*ledger, &l, c, schedule, opts, catch_up, cmd, seen, &stop).await {
            Ok(Slots::Stopped) => {
                drop(l);
                elector.shutdown().await;
                return Ok(0);
            }
            Ok(Slots::Unhealthy) => l.resign_for(c.ttl).await,
            Ok(Slots::TermOver) => {
                // Over, or too little of it left to start a run: wait for it to end or
                // for the next renewal.
                tokio::select! {
                    _ = l.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    _ = stop.cancelled() => {}
                }
            }
            Err(e) => {
                drop(l);
                elector.shutdown().await;
                return Err(e);
            }
        }
    }
}

/// What a `tenure schedule` process has dealt with.
struct Seen<'a> {
    /// When it started: the slots it can tell were given up come after.
    started: SystemTime,
    /// The latest slot it dealt with (run, found done or refused, or given up).
    handled: &'a mut SystemTime,
}

/// How a term of `tenure schedule` ended.
enum Slots {
    /// The term ended (or cannot start work any more).
    TermOver,
    /// SIGINT or SIGTERM.
    Stopped,
    /// The health check failed too often.
    Unhealthy,
}

/// Within the term `l`: runs every slot due and not done, oldest first (late ones too,
/// within `catch_up`), then waits for the next, until the term ends.
#[allow(clippy::too_many_arguments)]
async fn run_due_slots(
    ledger: &dyn LeaseStore,
    l: &Leadership,
    c: &Campaign,
    schedule: &Schedule,
    opts: &ScheduleOptions,
    catch_up: Duration,
    cmd: &[String],
    seen: Seen<'_>,
    stop: &CancellationToken,
) -> Result<Slots> {
    let handled = seen.handled;
    let now = SystemTime::now();
    let window = now.checked_sub(catch_up).unwrap_or(std::time::UNIX_EPOCH);
    if *handled < window {
        // A term of a process that has not dealt with this stretch of slots: it resumes
        // where the schedule left off, at the latest slot the ledger has an entry for (that
        // one included: its run may have been cut short; those before the catch-up are
        // given up). It looks back two catch-ups: the last leader may have fallen behind
        // by up to one before its term ended, and the slots after the one it reached are
        // still due. None there: the schedule has not run lately (a first start, or every
        // replica was down for longer than that), and the slots from this process's start
        // on are its own.
        let look_back = window.checked_sub(catch_up).unwrap_or(std::time::UNIX_EPOCH);
        *handled = match latest_recorded(ledger, l.election(), schedule, look_back, now).await? {
            Some(slot) => slot.checked_sub(Duration::from_millis(1)).unwrap_or(slot),
            None => seen.started.max(window),
        };
    }
    loop {
        let now = SystemTime::now();
        let window = now.checked_sub(catch_up).unwrap_or(std::time::UNIX_EPOCH);
        // Slots that came and went unrun while this process looked on (it led, and a run
        // took longer than the catch-up): given up.
        let looked_on = (*handled).max(seen.started);
        if looked_on < window {
            for slot in slots_between(schedule, looked_on, window).iter().rev().take(10) {
                if tenure::ledger::read(ledger, l.election(), &slot_key(*slot)).await.ok().flatten().is_none() {
                    tracing::info!(slot = %rfc3339(*slot), "slot given up: it was not run within --catch-up");
                }
            }
        }
        *handled = (*handled).max(window);
        for slot in slots_between(schedule, *handled, now) {
            if !can_start(l, c.grace) {
                return Ok(Slots::TermOver);
            }
            let key = slot_key(slot);
            let late = now.duration_since(slot).unwrap_or_default();
            let claimed = if crate::term::mutant("slot-by-local-clock") {
                // Planted: the slot decided by this replica's clock alone, as before the ledger.
                Some(Claim::Run { attempt: 1, after: None })
            } else {
                tenure::ledger::claim_in_term(ledger, l, &key, &opts.policy)
                    .await
                    .with_context(|| format!("cannot claim the slot {}", rfc3339(slot)))?
            };
            let attempt = match claimed {
                None | Some(Claim::Refused(_, Refusal::LaterTerm)) => return Ok(Slots::TermOver),
                Some(Claim::Done(entry)) => {
                    tracing::info!(
                        slot = %rfc3339(slot),
                        "slot skipped: done by {} (token {}) at {}",
                        entry.holder, entry.token, rfc3339(entry.at)
                    );
                    *handled = slot;
                    continue;
                }
                Some(Claim::Refused(entry, why)) => {
                    tracing::warn!(slot = %rfc3339(slot), "slot not run: {why} (last {} under token {})", entry.state, entry.token);
                    *handled = slot;
                    continue;
                }
                Some(Claim::Run { attempt, after }) => {
                    match &after {
                        Some(prev) => tracing::info!(
                            slot = %rfc3339(slot), attempt,
                            "slot run again: its run under token {} {}", prev.token,
                            if prev.state == WorkState::Failed { "failed" } else { "ended with its term" }
                        ),
                        None if late > SLOT_ON_TIME => tracing::info!(
                            slot = %rfc3339(slot), late = %humantime::format_duration(Duration::from_secs(late.as_secs())),
                            "slot run late (caught up)"
                        ),
                        None => tracing::info!(slot = %rfc3339(slot), "slot run"),
                    }
                    attempt
                }
            };
            let secs = slot.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
            let mut job = Job::new(cmd, c.grace, c.health.as_ref());
            job.env = vec![
                ("TENURE_SLOT", secs.to_string()),
                ("TENURE_ONCE_KEY", key.to_string()),
                ("TENURE_ONCE_ATTEMPT", attempt.to_string()),
            ];
            let end = supervise(l, &job, None, stop).await?;
            let once = OnceRun { key, policy: opts.policy };
            match end {
                End::Exited(code) => {
                    record_once(ledger, l, &once, code).await;
                    *handled = slot;
                }
                End::Stopped => return Ok(Slots::Stopped),
                End::Unhealthy => return Ok(Slots::Unhealthy),
                End::Lost | End::NotStarted => return Ok(Slots::TermOver),
            }
        }
        // Every due slot dealt with: wait for the next.
        let Some(next) = schedule.next_after(SystemTime::now().max(*handled)) else {
            tracing::warn!("the schedule has no further slots");
            return Ok(Slots::Stopped);
        };
        let wait = next.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = l.cancelled() => return Ok(Slots::TermOver),
            _ = stop.cancelled() => return Ok(Slots::Stopped),
        }
    }
}

/// The latest slot in `(window, now]`, or the one just before the window, that the
/// ledger has an entry for.
async fn latest_recorded(
    ledger: &dyn LeaseStore,
    election: &ElectionName,
    schedule: &Schedule,
    window: SystemTime,
    now: SystemTime,
) -> Result<Option<SystemTime>> {
    let mut slots = slots_between(schedule, window, now);
    // The slot just before the window, found by stepping back (a schedule only steps forward).
    let mut back = Duration::from_secs(1);
    while let Some(from) = window.checked_sub(back) {
        if let Some(before) = slots_between(schedule, from, window).last() {
            slots.insert(0, *before);
            break;
        }
        if back > Duration::from_secs(400 * 24 * 3600) {
            break;
        }
        back *= 4;
    }
    for slot in slots.into_iter().rev() {
        let entry = tenure::ledger::read(ledger, election, &slot_key(slot))
            .await
            .with_context(|| format!("cannot read the slot {}", rfc3339(slot)))?;
        if entry.is_some() {
            return Ok(Some(slot));
        }
    }
    Ok(None)
}

/// How late a slot may start and still count as on time in the logs.
const SLOT_ON_TIME: Duration = Duration::from_secs(1);
