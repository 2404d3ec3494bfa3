//! The work ledger: a unit of work done once per election, across replicas and terms.
//!
//! A lease says who leads; what a user hands tenure is usually a unit of work: *this*
//! nightly report, *this* cron slot, *this* task. The ledger keeps, per election, an
//! entry for each unit's [`WorkKey`]: which term ([`FencingToken`]) last claimed it,
//! whether its run finished, and how many runs were started. Every entry is written by a
//! compare-and-set on the version read (store duty 8), in the same store as the lease,
//! and every write is decided here by the term's token, so that:
//!
//! - a key whose run finished ([`WorkState::Done`]) is never claimed again while it is
//!   kept ([`Policy::keep`], 7 days by default);
//! - a claim is refused once a later term has claimed or ended the key: the ledger is a
//!   fenced resource of the election's own tokens, so an old leader's late write never
//!   undoes a newer term's;
//! - only the term that claimed a key can complete it or mark it failed;
//! - a key claimed by a term that ended before its run finished (the leader died, was
//!   frozen, lost its lease) is claimed again by a later term, with a larger token
//!   ([`Guarantee::AtLeastOnce`], the default), or never again
//!   ([`Guarantee::AtMostOnce`]);
//! - a run that failed leaves the key open for the next attempt, up to
//!   [`Policy::attempts`] runs in all (crashed runs count too).
//!
//! Two runs of one key never overlap because claims are made only within a term
//! (the caller claims while its [`crate::Leadership`] is valid and runs the work inside
//! that term), and terms never overlap (I1). [`crate::Elector::run_once`] puts it
//! together; `tenure run --once` and `tenure schedule` do the same with a command.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::elector::Leadership;
use crate::name::{ElectionName, HolderId, WorkKey};
use crate::record::FencingToken;
use crate::store::{ErrorKind, LeaseStore, LedgerWrite, StoreError};

/// How long a key's entry is kept after its last write, unless a [`Policy`] says otherwise.
pub const DEFAULT_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many runs of a key may start, unless a [`Policy`] says otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 3;

/// How many times one call reads and writes again when the entry changed under it.
const MAX_TRIES: usize = 8;

/// Where a key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkState {
    /// A run was started under the entry's token and has not been reported finished.
    Running,
    /// A run finished (its work succeeded) under the entry's token.
    Done,
    /// A run under the entry's token failed; the key is open for another attempt.
    Failed,
}

impl WorkState {
    fn as_str(self) -> &'static str {
        match self {
            WorkState::Running => "running",
            WorkState::Done => "done",
            WorkState::Failed => "failed",
        }
    }
}

impl fmt::Display for WorkState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key's entry in the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkEntry {
    /// Where the key stands.
    pub state: WorkState,
    /// The term that last claimed the key (and, if it is done or failed, ended its run).
    pub token: FencingToken,
    /// How many runs of the key were started, this one included.
    pub attempts: u32,
    /// The holder of that term.
    pub holder: HolderId,
    /// When the entry was written, by the writer's wall clock (for people to read).
    pub at: SystemTime,
}

impl WorkEntry {
    /// The format tag this version writes first in every entry.
    const TAG: &'static str = "tenure-work/1";

    fn new(state: WorkState, token: FencingToken, attempts: u32, holder: &HolderId) -> Self {
        Self { state, token, attempts, holder: holder.clone(), at: SystemTime::now() }
    }

    /// The entry as the store keeps it: one line of text.
    pub fn encode(&self) -> Vec<u8> {
        let at = self.at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        format!("{} {} {} {} {at} {}", Self::TAG, self.state, self.token.0, self.attempts, self.holder).into_bytes()
    }

    /// An entry as a store gave it back.
    pub fn decode(value: &[u8]) -> Result<Self, StoreError> {
        let bad = || {
            StoreError::new(
                ErrorKind::Misconfigured,
                format!(
                    "a work-ledger entry reads {:?}, which this version of tenure cannot read",
                    String::from_utf8_lossy(&value[..value.len().min(120)])
                ),
            )
        };
        let text = std::str::from_utf8(value).map_err(|_| bad())?;
        let mut f = text.split(' ');
        if f.next() != Some(Self::TAG) {
            return Err(bad());
        }
        let state = match f.next() {
            Some("running") => WorkState::Running,
            Some("done") => WorkState::Done,
            Some("failed") => WorkState::Failed,
            _ => return Err(bad()),
        };
        let token = f.next().and_then(|t| t.parse().ok()).map(FencingToken).ok_or_else(bad)?;
        let attempts = f.next().and_then(|a| a.parse().ok()).ok_or_else(bad)?;
        // Up to the last millisecond of year 9999, which every date format can print.
        let at_ms: u64 =
            f.next().and_then(|a| a.parse().ok()).filter(|&ms| ms <= 253_402_300_799_999).ok_or_else(bad)?;
        let holder = f.next().and_then(|h| HolderId::new(h).ok()).ok_or_else(bad)?;
        if f.next().is_some() {
            return Err(bad());
        }
        let at = UNIX_EPOCH + Duration::from_millis(at_ms);
        Ok(Self { state, token, attempts, holder, at })
    }
}

/// What a run of a key promises when its term ends before the run finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Guarantee {
    /// A later term runs the key again (with a larger token, which a fenced resource
    /// tells from the earlier run's): at least once across crashes, never two at once.
    #[default]
    AtLeastOnce,
    /// A key is claimed before its run starts and never claimed again: at most once,
    /// and a run cut short is not run again. A failed run is not run again either.
    AtMostOnce,
}

/// How keys are run: the guarantee, how many runs a key may start, how long entries are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// What happens to a key whose run was cut short.
    pub guarantee: Guarantee,
    /// How many runs of a key may start in all, counting failed and cut-short ones
    /// (at least 1; with [`Guarantee::AtMostOnce`] only the first ever starts).
    pub attempts: u32,
    /// How long an entry is kept after its last write: a key done within this long is
    /// not run again.
    pub keep: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self { guarantee: Guarantee::AtLeastOnce, attempts: DEFAULT_ATTEMPTS, keep: DEFAULT_KEEP }
    }
}

/// Why a claim was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A later term has claimed or ended the key: the claiming term is over.
    LaterTerm,
    /// An earlier run may have started ([`Guarantee::AtMostOnce`]).
    MayHaveRun,
    /// The key has started [`Policy::attempts`] runs without finishing.
    NoAttemptsLeft,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::LaterTerm => "a later term has claimed it",
            Refusal::MayHaveRun => "a run of it may have started before (at most once)",
            Refusal::NoAttemptsLeft => "it has used up its attempts",
        })
    }
}

/// The answer to [`claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Run it: the term has claimed the key. `attempt` counts runs from 1; `after` is
    /// the entry this claim replaced (a failed run, or one whose term ended first).
    Run {
        /// This run's number among the key's runs.
        attempt: u32,
        /// The entry before this claim, if a run came before.
        after: Option<WorkEntry>,
    },
    /// A run of the key finished: nothing to do.
    Done(WorkEntry),
    /// Not to be run by this term.
    Refused(WorkEntry, Refusal),
}

/// The entry of `key` in `election`'s ledger, if there is one.
pub async fn read(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
) -> Result<Option<WorkEntry>, StoreError> {
    match store.ledger_read(election, key).await? {
        Some(e) => WorkEntry::decode(&e.value).map(Some),
        None => Ok(None),
    }
}

/// Claims `key` for the term `token` of `holder`, by `policy`'s rules (see the module
/// documentation). Call it while the term is valid, and start the work only on
/// [`Claim::Run`] and only within that term.
pub async fn claim(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
    token: FencingToken,
    holder: &HolderId,
    policy: &Policy,
) -> Result<Claim, StoreError> {
    update(store, election, key, policy.keep, |cur| {
        let Some(cur) = cur else {
            return Step::Write(
                WorkEntry::new(WorkState::Running, token, 1, holder),
                Claim::Run { attempt: 1, after: None },
            );
        };
        if cur.state == WorkState::Done {
            return Step::Answer(Claim::Done(cur.clone()));
        }
        if cur.token > token {
            return Step::Answer(Claim::Refused(cur.clone(), Refusal::LaterTerm));
        }
        if cur.state == WorkState::Running && cur.token == token {
            // This term claimed it already (an answer lost, a second call).
            return Step::Answer(Claim::Run { attempt: cur.attempts, after: None });
        }
        if policy.guarantee == Guarantee::AtMostOnce {
            return Step::Answer(Claim::Refused(cur.clone(), Refusal::MayHaveRun));
        }
        if cur.attempts >= policy.attempts.max(1) {
            return Step::Answer(Claim::Refused(cur.clone(), Refusal::NoAttemptsLeft));
        }
        let attempt = cur.attempts + 1;
        Step::Write(
            WorkEntry::new(WorkState::Running, token, attempt, holder),
            Claim::Run { attempt, after: Some(cur.clone()) },
        )
    })
    .await
}

/// Reports that the run of `key` claimed by the term `token` finished: the key is done
/// and is not run again while it is kept. Answers false, and writes nothing, if the
/// key is not claimed by that term (a later term claimed it: this term's report came too
/// late, and the later run stands).
pub async fn complete(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
    token: FencingToken,
    keep: Duration,
) -> Result<bool, StoreError> {
    end(store, election, key, token, keep, WorkState::Done).await
}

/// Reports that the run of `key` claimed by the term `token` failed: the key is open for
/// another attempt. Answers false, and writes nothing, if the key is not claimed by that
/// term.
pub async fn fail(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
    token: FencingToken,
    keep: Duration,
) -> Result<bool, StoreError> {
    end(store, election, key, token, keep, WorkState::Failed).await
}

async fn end(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
    token: FencingToken,
    keep: Duration,
    state: WorkState,
) -> Result<bool, StoreError> {
    update(store, election, key, keep, |cur| match cur {
        Some(cur)
            if cur.state == WorkState::Running && (cur.token == token || crate::mutant("ledger-end-any-token")) =>
        {
            Step::Write(WorkEntry::new(state, cur.token, cur.attempts, &cur.holder), true)
        }
        // Written already (an answer that was lost).
        Some(cur) if cur.token == token && cur.state == state => Step::Answer(true),
        _ => Step::Answer(false),
    })
    .await
}

/// How long a ledger call that the store refused for now waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Runs `op` until it answers, within `l`'s term: a refusal for now is tried again, and
/// the answer is `None` if the term ends (or its deadline passes) first; `Err` is a
/// refusal no retry can mend. For the ledger calls a term makes ([`claim_in_term`],
/// [`complete`], [`fail`]).
pub async fn in_term<T, Fut>(l: &Leadership, op: impl Fn() -> Fut) -> Result<Option<T>, StoreError>
where
    Fut: Future<Output = Result<T, StoreError>>,
{
    loop {
        let left = l.remaining();
        if left.is_zero() || !l.is_valid() {
            return Ok(None);
        }
        match tokio::time::timeout(left, op()).await {
            Err(_) => return Ok(None),
            Ok(Ok(v)) => return Ok(Some(v)),
            Ok(Err(e)) if e.is_retryable() => {
                tokio::select! {
                    _ = l.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(RETRY_AFTER) => {}
                }
            }
            Ok(Err(e)) => return Err(e),
        }
    }
}

/// [`claim`]s `key` for the term `l`, within it (see [`in_term`]).
pub async fn claim_in_term(
    store: &dyn LeaseStore,
    l: &Leadership,
    key: &WorkKey,
    policy: &Policy,
) -> Result<Option<Claim>, StoreError> {
    in_term(l, || claim(store, l.election(), key, l.token(), l.holder(), policy)).await
}

/// What [`update`]'s decision does.
enum Step<T> {
    /// Write this entry (conditionally on the entry read), then answer `T`.
    Write(WorkEntry, T),
    /// Answer without writing.
    Answer(T),
}

/// Reads the entry, lets `decide` choose, and writes conditionally on what was read,
/// reading and deciding again when the entry changed meanwhile. A write that may or may
/// not have been applied is settled by reading: the entry is then exactly the one
/// written (its time is part of it), or it was not applied.
async fn update<T>(
    store: &dyn LeaseStore,
    election: &ElectionName,
    key: &WorkKey,
    keep: Duration,
    decide: impl Fn(Option<&WorkEntry>) -> Step<T>,
) -> Result<T, StoreError> {
    for _ in 0..MAX_TRIES {
        let stored = store.ledger_read(election, key).await?;
        let cur = stored.as_ref().map(|s| WorkEntry::decode(&s.value)).transpose()?;
        let (next, answer) = match decide(cur.as_ref()) {
            Step::Answer(a) => return Ok(a),
            Step::Write(next, a) => (next, a),
        };
        let value = next.encode();
        let expected = stored.as_ref().map(|s| s.version.as_str());
        match store.ledger_write(election, key, &value, expected, keep).await {
            Ok(LedgerWrite::Written(_)) => return Ok(answer),
            Ok(LedgerWrite::Conflict) => continue,
            Err(e) if e.kind() == ErrorKind::Ambiguous => match store.ledger_read(election, key).await? {
                Some(now) if now.value == value => return Ok(answer),
                _ => continue,
            },
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::unavailable(format!(
        "the work-ledger entry {key} of {election} changed under every one of {MAX_TRIES} writes; retrying"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_as_written_and_junk_is_refused() {
        let e = WorkEntry::new(WorkState::Failed, FencingToken(42), 3, &HolderId::new("web-1.77.ab").unwrap());
        let back = WorkEntry::decode(&e.encode()).unwrap();
        assert_eq!(back.state, e.state);
        assert_eq!((back.token, back.attempts, back.holder.clone()), (e.token, e.attempts, e.holder.clone()));
        assert!(e.at.duration_since(back.at).unwrap() < Duration::from_millis(1));
        for junk in [
            &b""[..],
            b"tenure-work/2 done 1 1 0 h",
            b"tenure-work/1 doing 1 1 0 h",
            b"tenure-work/1 done x 1 0 h",
            b"tenure-work/1 done 1 1 0 h extra",
            b"tenure-work/1 done 1 1 18446744073709551615 h",
            b"tenure-work/1 done 1 1 0 bad/holder",
            b"\xff\xfe",
        ] {
            let err = WorkEntry::decode(junk).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Misconfigured, "{junk:?}");
        }
    }
}
