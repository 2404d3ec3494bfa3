//! Releasing a lease, and checking that it is gone.

use super::*;

/// Releases `lease` and checks: a renewal that timed out may still have been applied and
/// moved the revision, which makes the release match nothing; then the record as it
/// stands is released, and read again, until it is gone or another's: a store may apply
/// more than one renewal late (a batch goes on with its rounds after its caller gave up),
/// each just before a release. A record of this holder with another token is a grant of
/// ours that landed late (a proclamation's acquire): released too, since this candidate
/// leads nothing while it releases. The check is made even when the release failed (it
/// may have timed out, or gone in a batch that failed), so that the lease does not live
/// on, which on a store whose elections share one lease per process lasts as long as the
/// process. All of it within [`RELEASE_TIMEOUTS`] request timeouts, and every path ends on
/// a read. True if the lease is gone; false if another holds it, or if it still stood
/// when the checks ran out (logged).
pub(super) async fn release(shared: &Shared, lease: &LeaseRecord) -> Result<bool, StoreError> {
    let timeout = shared.cfg.request_timeout;
    let end = shared.clock.now() + timeout * RELEASE_TIMEOUTS;
    let until = || (shared.clock.now() + timeout).min(end);
    let mut released = call(shared, "release", until(), shared.store.release(lease)).await;
    let mut checks = if crate::mutant("release-checked-once") { 1 } else { RELEASE_CHECKS };
    loop {
        if shared.clock.now() >= end {
            return Err(StoreError::timed_out("release and its check", timeout * RELEASE_TIMEOUTS));
        }
        // Taken out of the answer in a statement of its own: the future then keeps one
        // record across the next release, not two.
        let cur = match call(shared, "get", until(), shared.store.get(&lease.election)).await {
            Err(e) => return Err(released.err().unwrap_or(e)),
            Ok(Some(cur)) if cur.holder == lease.holder => cur,
            Ok(Some(_)) => return Ok(false),
            Ok(None) => return Ok(true),
        };
        if checks == 0 {
            // Why it still stands: the store refused the releases (a full disk, a read-only
            // server), or they were applied and renewals given up on kept landing behind them.
            match &released {
                Err(e) => tracing::warn!(election = %lease.election, token = %cur.token,
                    "the lease still stands: releasing it failed {} times, the last time with: {}; it will expire on its own",
                    RELEASE_CHECKS + 1, error_chain(e)),
                Ok(()) => tracing::warn!(election = %lease.election, token = %cur.token,
                    "the lease still stands after releasing it {} times (renewals given up on kept landing late); it will expire on its own",
                    RELEASE_CHECKS + 1),
            }
            return Ok(false);
        }
        checks -= 1;
        released = call(shared, "release", until(), shared.store.release(&cur)).await;
    }
}

/// How many times a release releases the record again after reading it still ours: each
/// late renewal that lands just before a release costs one.
pub(super) const RELEASE_CHECKS: usize = 3;

/// How many request timeouts a release may take in all, whatever the store does.
pub(super) const RELEASE_TIMEOUTS: u32 = 3;

/// Releases a lease under which no work ran.
pub(super) async fn give_back(shared: &Shared, lease: &LeaseRecord) {
    if let Err(e) = release(shared, lease).await {
        tracing::warn!(election = %shared.req.election, error = %e, "release failed or could not be confirmed; the lease will expire on its own");
    }
}
