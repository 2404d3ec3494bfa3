//! What a winner asks the store about other candidates: the other kind, a successor.

use super::*;

/// Whether candidates of the other kind hold the election, as a winner sees it before its
/// term is handed out: for a slot's winner, the election's own lease (one `get`); for a
/// single winner, in its first term only, the slots (one `list`), since that kind can
/// only have joined since it started. A store that does not answer says nobody: the check
/// is a second line behind the command line's check at start, never a reason to wait.
pub(super) async fn other_kind(shared: &Shared, slot: Option<u32>, until: Instant) -> Option<String> {
    let e = &shared.req.election;
    if e.as_str().starts_with(crate::RESERVED_PREFIX) || crate::mutant("kinds-unchecked") {
        return None;
    }
    match slot {
        Some(i) => match call(shared, "get", until, shared.store.get(e)).await {
            Ok(Some(r)) => Some(format!(
                "{e} is held by {} as its only holder, while this candidate won holder index {i} of {}; \
                 every candidate of an election needs the same number of holders",
                r.holder, shared.cfg.holders
            )),
            _ => None,
        },
        None if !shared.kinds_checked.swap(true, std::sync::atomic::Ordering::SeqCst) => {
            match call(shared, "list", until, crate::holders::holders(&*shared.store, e)).await {
                Ok(h) if !h.is_empty() => Some(format!(
                    "{} candidate(s) with several holders hold {e} (holder {}, index {}), while this candidate \
                     won it as its only holder; every candidate of an election needs the same number of holders",
                    h.len(),
                    h[0].record.holder,
                    h[0].index
                )),
                _ => None,
            }
        }
        None => None,
    }
}

/// Whom this announcing winner should give the election to, if anyone (one `list`). A
/// reservation that names this candidate has served its purpose and is ended. A store
/// that does not answer in time says nobody: priorities never hold up an election.
pub(super) async fn successor(shared: &Shared, until: Instant) -> Option<Successor> {
    let me = &shared.req.holder;
    let standing = match call(shared, "list", until, Standing::read(&*shared.store, &shared.req.election)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(election = %shared.req.election, error = %e, "could not list the candidates");
            return None;
        }
    };
    let next = standing.successor(me, shared.cfg.priority);
    if next.is_none()
        && let Some(rec) = standing.reserved_for_me(me)
    {
        // Within the caller's time (a leader's step-down time): not a moment longer.
        let _ = call(shared, "release", until, shared.store.release(rec)).await;
    }
    next
}

/// Reserves the election for `to` for one TTL, so that no other announcing candidate
/// slips in between the release and the successor's acquire. Best effort: a reservation
/// that fails costs a handover, not safety.
pub(super) async fn reserve(shared: &Shared, to: &HolderId) {
    let until = shared.clock.now() + shared.cfg.request_timeout;
    let r = crate::presence::reserve(&*shared.store, &shared.req.election, to, &shared.req.holder, shared.cfg.ttl);
    if let Err(e) = call(shared, "reserve", until, r).await {
        tracing::warn!(election = %shared.req.election, successor = %to, error = %e, "could not reserve the election for the successor; releasing anyway");
    }
}
