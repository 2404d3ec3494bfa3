//! `tenure campaign`: a sidecar that leads without a command of its own, running hooks as
//! terms begin and end.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tenure::LeaseStore;

use crate::run::{Campaign, End, InTerm, Job, begin, child_env, next_term, run_sh, say, supervise, unhealthy};
use crate::term::Supervised;
use crate::term::can_start;

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
        say(&format!("elected {}", l.token()));
        let mut end = match on_elected {
            // The hook runs inside the term like tenure run's command: stopped if the term
            // ends first. Its finishing is not the end of the term.
            Some(hook) if can_start(&l, c.grace) => {
                let hook = ["sh".to_string(), "-c".to_string(), hook.to_string()];
                match supervise(&l, &Job::new(&hook, c.grace, c.health.as_ref()), None, &stop).await? {
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
                why = unhealthy(c.health.as_ref(), &l, None) => {
                    tracing::warn!(token = %l.token(), "{why}; standing aside for one TTL");
                    End::Unhealthy
                }
            });
        }
        // The term is over (or ending): tell the program before the lease goes.
        say(&format!("stepped-down {}", l.token()));
        if let Some(hook) = on_stepped_down {
            // Past the deadline (this process frozen or stuck through it), the next leader
            // may already run its on-elected hook: the hook still runs, for it undoes what
            // this term did here, but the program must be told it comes late.
            let late = tenure::Clock::now(&tenure::TokioClock).saturating_duration_since(l.deadline());
            if !late.is_zero() {
                tracing::warn!(
                    token = %l.token(),
                    "the term ended {} ago, while this process could not act (frozen or stuck): the on-stepped-down \
                     hook runs now, late, and another candidate may already lead (fence with TENURE_TOKEN)",
                    humantime::format_duration(Duration::from_millis(late.as_millis() as u64))
                );
            }
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

/// How long a hook stopped for taking too long (SIGTERM) has before SIGKILL.
const HOOK_KILL_AFTER: Duration = Duration::from_millis(100);

/// Runs the on-stepped-down hook (`sh -c`) with `env` as `tenure run` runs a command:
/// under a supervisor, with its guard and cgroup, so that every process the hook starts
/// ends with it, and with `tenure` if `tenure` is killed meanwhile (it must be over
/// before anyone else can lead). Stopped if it takes longer than `limit`.
async fn run_hook(hook: &str, env: &[(&'static str, String)], limit: Duration) {
    if crate::term::mutant("hook-unsupervised") {
        // The planted bug: only the hook's shell ends with `tenure`.
        if let Err(why) = run_sh(hook, env, limit, "on-stepped-down hook", InTerm { cgroup: None }).await {
            tracing::warn!("{why}");
        }
        return;
    }
    let argv = ["sh".to_string(), "-c".to_string(), hook.to_string()];
    let kill_after = HOOK_KILL_AFTER.min(limit / 2);
    let stop_at = crate::term::boottime_ns().saturating_add((limit - kill_after).as_nanos() as u64);
    let mut hook = match Supervised::spawn(&argv, env, stop_at, kill_after, None) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot start the on-stepped-down hook: {e:#}");
            return;
        }
    };
    let code = hook.exited().await;
    hook.clean_up().await;
    if hook.stopped_by_supervisor() {
        tracing::warn!("the on-stepped-down hook took longer than {}; stopped", humantime::format_duration(limit));
    } else if code != 0 {
        tracing::warn!(code, "the on-stepped-down hook failed");
    }
}
