//! Several holders of one election at a time ([`Config::holders`](crate::Config::holders)).
//!
//! An election with `holders = N > 1` is held through N *slots*, each an ordinary lease
//! under [`RESERVED_PREFIX`]: `.tenure/holders/<election>/<index>`, index `0..N`. A
//! candidate holds at most one slot; while it holds none it tries the slots it finds free
//! one at a time, so it never holds two, and waits on their watches (or their expiries)
//! otherwise. Every slot is a whole lease of the store contract, so everything the
//! contract guarantees of one lease holds of each slot: one holder at a time, a token
//! that grows with every grant, expiry by the store's clock. Hence no more than N hold at
//! once (I7), and a freed slot, released or expired, is taken again like any lease.
//!
//! **Tokens.** The token a holder of slot `i` gets is `slot token × 1000 + i`
//! ([`holder_token`]): it grows with every grant of that slot, and no two grants of the
//! election share one. Tokens of different slots are not ordered against each other, so
//! a resource fenced by N holders keeps the highest token it accepted *per holder index*
//! ([`holder_index`] recovers it from a token).
//!
//! **Cost.** N slots are N records in the store, and a waiting candidate watches N
//! records (or polls them, where the store cannot watch).
//!
//! **One holder and several are different elections in the store:** a candidate with
//! `holders = 1` holds the election's own lease, one with more holds slots. Candidates of
//! one election should all be started with the same N. A changed N > 1 is taken up as
//! candidates restart: each takes only slots below its own N, so while candidates with
//! different N run, no more than the largest of them hold. Between one holder and
//! several, [`check_holders`] tells a starting candidate whether the other kind holds the
//! election, so that it can refuse to start (the `tenure` command does).

use crate::name::{ElectionName, NameError};
use crate::presence::RESERVED_PREFIX;
use crate::record::{FencingToken, LeaseRecord};
use crate::store::{LeaseStore, StoreError};

/// The most holders an election may have.
pub const MAX_HOLDERS: u32 = 1000;

/// The longest election name that can have several holders: its slots' names must fit
/// in the 200 characters of a name.
pub const MAX_HOLDERS_NAME: usize = 200 - SLOTS.len() - 4;

const SLOTS: &str = ".tenure/holders/";

/// The prefix of every slot name of `election`.
pub fn slot_prefix(election: &ElectionName) -> String {
    format!("{RESERVED_PREFIX}holders/{election}/")
}

/// The name of slot `index` of `election`.
pub fn slot_name(election: &ElectionName, index: u32) -> Result<ElectionName, NameError> {
    ElectionName::new(format!("{}{index}", slot_prefix(election)))
}

/// The election and index of a slot name, or `None` if `name` names no slot.
pub fn parse_slot(name: &ElectionName) -> Option<(ElectionName, u32)> {
    let rest = name.as_str().strip_prefix(SLOTS)?;
    let (election, digits) = rest.rsplit_once('/')?;
    let index: u32 = digits.parse().ok().filter(|i| *i < MAX_HOLDERS)?;
    if index.to_string() != digits {
        return None;
    }
    Some((ElectionName::new(election).ok()?, index))
}

/// The fencing token of a holder of slot `index` whose slot lease carries `slot_token`:
/// `slot_token × 1000 + index`.
pub fn holder_token(slot_token: FencingToken, index: u32) -> FencingToken {
    FencingToken(slot_token.0.saturating_mul(u64::from(MAX_HOLDERS)).saturating_add(u64::from(index)))
}

/// The holder index a token of an election with several holders was granted to.
pub fn holder_index(token: FencingToken) -> u32 {
    (token.0 % u64::from(MAX_HOLDERS)) as u32
}

/// One holder of an election with several, as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its slot: 0 to N − 1, what `TENURE_HOLDER_INDEX` tells its command.
    pub index: u32,
    /// Its token ([`holder_token`]).
    pub token: FencingToken,
    /// The slot's lease record (whose token is the slot's own).
    pub record: LeaseRecord,
}

/// The live holders of `election`'s slots, by index (one `list`).
pub async fn holders(store: &dyn LeaseStore, election: &ElectionName) -> Result<Vec<Holder>, StoreError> {
    let mut out: Vec<Holder> = store
        .list(&slot_prefix(election))
        .await?
        .into_iter()
        .filter_map(|record| {
            let (e, index) = parse_slot(&record.election)?;
            (e == *election).then(|| Holder { index, token: holder_token(record.token, index), record })
        })
        .collect();
    out.sort_by_key(|h| h.index);
    Ok(out)
}

/// Whether the *other* kind of candidate holds `election` now: for `holders = 1`, a
/// live slot; for more, the election's own lease. `Some` names what was found, for an
/// error that says why a candidate refuses to start.
pub async fn check_holders(
    store: &dyn LeaseStore,
    election: &ElectionName,
    holders: u32,
) -> Result<Option<String>, StoreError> {
    if holders <= 1 {
        let found = self::holders(store, election).await?;
        Ok(found.first().map(|h| {
            format!(
                "{} candidate(s) with several holders hold {election} (holder {}, index {}); \
                 every candidate of an election needs the same --holders",
                found.len(),
                h.record.holder,
                h.index
            )
        }))
    } else {
        Ok(store.get(election).await?.map(|r| {
            format!(
                "{election} is held by {} as its only holder (a candidate with --holders 1); \
                 every candidate of an election needs the same --holders",
                r.holder
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_round_trip_and_nothing_else_parses_as_one() {
        let e = ElectionName::new("billing/nightly").unwrap();
        for i in [0, 1, 7, 999] {
            assert_eq!(parse_slot(&slot_name(&e, i).unwrap()), Some((e.clone(), i)));
        }
        let long = ElectionName::new("a".repeat(MAX_HOLDERS_NAME)).unwrap();
        assert!(slot_name(&long, MAX_HOLDERS - 1).is_ok(), "the longest name allowed has slots");
        for other in [
            ".tenure/holders/x/01",
            ".tenure/holders/x/1000",
            ".tenure/holders/x",
            "billing/nightly",
            ".tenure/holders/x/y",
        ] {
            assert_eq!(parse_slot(&ElectionName::new(other).unwrap()), None, "{other}");
        }
    }

    #[test]
    fn holder_tokens_grow_per_slot_and_never_meet_across_slots() {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..5 {
            let mut last = None;
            for t in 1..50 {
                let tok = holder_token(FencingToken(t), i);
                assert_eq!(holder_index(tok), i);
                assert!(last < Some(tok));
                last = Some(tok);
                assert!(seen.insert(tok), "{tok} granted twice");
            }
        }
        // SQLite's first tokens are microseconds of the wall clock.
        let us = 1_800_000_000_000_000;
        assert!(holder_token(FencingToken(us), 3) < holder_token(FencingToken(us + 1), 3));
    }
}
