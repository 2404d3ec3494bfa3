//! The open-file limit: raised for `tenure`, and lowered again for the command.

/// The soft descriptor limit this process started with, if [`raise_descriptor_limit`]
/// raised it.
pub(super) static STARTING_DESCRIPTOR_LIMIT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Tells the supervisor the soft descriptor limit to give the command back.
pub(super) const DESCRIPTOR_LIMIT_ENV: &str = "TENURE_INTERNAL_NOFILE";

/// Raises this process's soft limit on open descriptors to its hard limit, so that the
/// connections of `--http` and the dashboard cannot take the descriptors that renewing the
/// lease and keeping the command's deadline need. The command, the hooks and health
/// checks get the limit back as it was: some programs expect the usual soft limit.
pub fn raise_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let start = getrlimit(Resource::Nofile);
    let Some(soft) = start.current else { return };
    if start.maximum.is_some_and(|hard| hard <= soft) {
        return;
    }
    match setrlimit(Resource::Nofile, Rlimit { current: start.maximum, maximum: start.maximum }) {
        Ok(()) => {
            let _ = STARTING_DESCRIPTOR_LIMIT.set(soft);
        }
        Err(e) => tracing::debug!(error = %e, "cannot raise the descriptor limit"),
    }
}

/// The soft descriptor limit this process started with, if it raised it.
pub fn starting_descriptor_limit() -> Option<u64> {
    STARTING_DESCRIPTOR_LIMIT.get().copied()
}

/// In the supervisor: sets the soft descriptor limit back to what `tenure run` started
/// with (passed in [`DESCRIPTOR_LIMIT_ENV`]), before it starts the command.
pub(super) fn lower_descriptor_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let Some(soft) = std::env::var(DESCRIPTOR_LIMIT_ENV).ok().and_then(|v| v.parse::<u64>().ok()) else { return };
    let now = getrlimit(Resource::Nofile);
    if let Err(e) = setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum: now.maximum }) {
        eprintln!("tenure: warning: cannot set the command's descriptor limit back to {soft}: {e}");
    }
}
