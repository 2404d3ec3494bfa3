//! Candidates that announce themselves, so that operators and programs can list them
//! beside the leader (Curator's `getParticipants`).
//!
//! A candidate with [`Config::announce`](crate::Config::announce) holds a *presence
//! lease* of its own, uncontested, under [`RESERVED_PREFIX`]: the holder id, its
//! priority and metadata, renewed like any lease and expiring on its own a TTL after
//! the candidate stops renewing it. It costs one store call per renew interval per
//! candidate (through [`Batched`](crate::Batched), a share of one).
//!
//! Announcing candidates also honour priorities. A leader that announces lists the
//! candidates when it wins (before its term is handed out) and after each renewal; when a
//! live candidate has a higher priority, it steps down gracefully for it: its work
//! stops, it *reserves* the election for that successor, then releases. A reservation is
//! one more ordinary lease beside the presence leases, naming the successor and expiring
//! a TTL after it was written; an announcing candidate that wins while a live reservation
//! names someone else gives the lease back at once, before any work starts, and waits for
//! the reservation to end. Nothing in this is needed for safety: every grant is still the
//! store's compare-and-set, so a late or missed reservation can only cost a handover,
//! never make two leaders.

use std::time::{Duration, SystemTime};

use crate::name::{ElectionName, HolderId};
use crate::record::{Acquire, AcquireRequest, LeaseRecord, MAX_METADATA};
use crate::store::{LeaseStore, StoreError};

/// Election names under this prefix belong to tenure itself (presence leases); listings
/// meant for people leave them out.
pub const RESERVED_PREFIX: &str = ".tenure/";

/// A candidate of an election, as its presence lease tells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The candidate's holder id.
    pub holder: HolderId,
    /// Its priority ([`Config::priority`](crate::Config::priority)).
    pub priority: i32,
    /// Its metadata ([`Config::metadata`](crate::Config::metadata)), cut to fit beside
    /// the priority in one lease.
    pub metadata: Vec<u8>,
    /// What it last said about its health while leading
    /// ([`Leadership::set_health`](crate::Leadership::set_health)), if it did.
    pub health: Option<Health>,
    /// When it last renewed its presence, where the store keeps the time.
    pub seen_at: Option<SystemTime>,
    /// How long its presence lasts without another renewal, where the store knows.
    pub expires_in: Option<Duration>,
}

/// A leader's health, as its own check last found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// The last check passed.
    Passing,
    /// The last check failed (or timed out); the leader stands aside after enough of them.
    Failing,
}

impl Health {
    /// `passing` or `failing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Passing => "passing",
            Health::Failing => "failing",
        }
    }
}

/// The live candidates of `election` that announce themselves, by holder id.
pub async fn candidates(store: &dyn LeaseStore, election: &ElectionName) -> Result<Vec<Candidate>, StoreError> {
    let mut out: Vec<Candidate> = store.list(&prefix(election)).await?.iter().filter_map(candidate).collect();
    out.sort_by(|a, b| a.holder.cmp(&b.holder));
    Ok(out)
}

/// Reserves `election` for `successor` for `window`: the reservation lease, held by `by`,
/// names it, so that announcing candidates other than `successor` that win the election
/// meanwhile give it back at once. What a leader handing over does between stopping its
/// work and releasing, and what `tenure evict --to` does before evicting. A reservation
/// someone else holds is replaced. Answers the reservation's record, to renew it with
/// [`LeaseStore::renew`] or end it with [`LeaseStore::release`].
pub async fn reserve(
    store: &dyn LeaseStore,
    election: &ElectionName,
    successor: &HolderId,
    by: &HolderId,
    window: Duration,
) -> Result<LeaseRecord, StoreError> {
    let name = reservation(election);
    let req = AcquireRequest::new(name.clone(), by.clone(), window).with_metadata(encode_reservation(successor));
    for _ in 0..3 {
        match store.try_acquire(&req).await? {
            Acquire::Acquired(rec) => return Ok(rec),
            // An earlier reservation by someone else (a leader before, an operator): this
            // one is newer.
            Acquire::Held(cur) => store.release(&cur).await?,
        }
    }
    Err(StoreError::unavailable(format!("{name}: the reservation kept changing hands")))
}

/// What the announcing candidates of an election say about who should lead: a live
/// reservation, and the candidates. One `list`.
#[derive(Debug, Default)]
pub(crate) struct Standing {
    reservation: Option<(LeaseRecord, HolderId)>,
    candidates: Vec<Candidate>,
}

/// Whom a winner should give the election to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Successor {
    /// A live reservation names this other candidate, which announces itself; the
    /// reservation ends in `remaining`.
    Reserved { to: HolderId, remaining: Duration },
    /// This live candidate has a higher priority (the highest; among equals, the first
    /// holder id).
    Higher(HolderId),
}

impl Standing {
    pub(crate) async fn read(store: &dyn LeaseStore, election: &ElectionName) -> Result<Self, StoreError> {
        let mut out = Standing::default();
        let name = reservation(election);
        for rec in store.list(&prefix(election)).await? {
            if rec.election == name {
                if let Some(to) = reserved_for(&rec) {
                    out.reservation = Some((rec, to));
                }
            } else if let Some(c) = candidate(&rec) {
                out.candidates.push(c);
            }
        }
        Ok(out)
    }

    /// Whom `me`, of `priority`, should give the election to, if anyone.
    pub(crate) fn successor(&self, me: &HolderId, priority: i32) -> Option<Successor> {
        // A reservation counts only while its successor announces itself: one that stopped
        // or stands aside will not come for the election.
        if let Some((rec, to)) = &self.reservation
            && to != me
            && !rec.evicted
            && self.candidates.iter().any(|c| c.holder == *to)
        {
            let remaining = rec.remaining.unwrap_or(rec.ttl);
            return Some(Successor::Reserved { to: to.clone(), remaining });
        }
        self.candidates
            .iter()
            .filter(|c| c.priority > priority && c.holder != *me)
            .max_by(|a, b| a.priority.cmp(&b.priority).then_with(|| b.holder.cmp(&a.holder)))
            .map(|c| Successor::Higher(c.holder.clone()))
    }

    /// The reservation, if it names `me`: it has served its purpose once `me` leads.
    pub(crate) fn reserved_for_me(&self, me: &HolderId) -> Option<&LeaseRecord> {
        self.reservation.as_ref().filter(|(_, to)| to == me).map(|(rec, _)| rec)
    }
}

/// The reservation lease of `election`: beside the presence leases, so that one `list`
/// reads both (its name cannot be a presence lease's, which ends in 16 hex digits).
pub(crate) fn reservation(election: &ElectionName) -> ElectionName {
    ElectionName::new(format!("{}handover", prefix(election))).expect("a reserved prefix and a word form a valid name")
}

const RESERVATION: &str = "tenure-handover\n";

fn encode_reservation(successor: &HolderId) -> Vec<u8> {
    format!("{RESERVATION}{successor}").into_bytes()
}

fn reserved_for(rec: &LeaseRecord) -> Option<HolderId> {
    let text = std::str::from_utf8(&rec.metadata).ok()?;
    HolderId::new(text.strip_prefix(RESERVATION)?).ok()
}

/// Where the presence leases of `election` live: a fixed-length name, whatever the
/// election's length (names are hashed; the holder id is in each record).
pub(crate) fn prefix(election: &ElectionName) -> String {
    format!("{RESERVED_PREFIX}candidates/{:016x}/", fnv1a(election.as_str()))
}

/// The presence lease of `holder` in `election`.
pub(crate) fn name(election: &ElectionName, holder: &HolderId) -> ElectionName {
    ElectionName::new(format!("{}{:016x}", prefix(election), fnv1a(holder.as_str())))
        .expect("a reserved prefix and two hashes form a valid name")
}

/// What a presence lease publishes: `tenure-candidate PRIORITY[ health=passing|failing]\n`,
/// then the metadata.
pub(crate) fn encode(priority: i32, health: Option<Health>, metadata: &[u8]) -> Vec<u8> {
    let health = health.map(|h| format!(" health={}", h.as_str())).unwrap_or_default();
    let mut v = format!("tenure-candidate {priority}{health}\n").into_bytes();
    let room = MAX_METADATA - v.len();
    v.extend_from_slice(&metadata[..metadata.len().min(room)]);
    v
}

fn candidate(rec: &LeaseRecord) -> Option<Candidate> {
    if rec.evicted {
        return None;
    }
    let nl = rec.metadata.iter().position(|&b| b == b'\n')?;
    let (priority, health) = header(&rec.metadata[..nl])?;
    Some(Candidate {
        holder: rec.holder.clone(),
        priority,
        health,
        metadata: rec.metadata[nl + 1..].to_vec(),
        seen_at: rec.renewed_at.or(rec.acquired_at),
        expires_in: rec.remaining,
    })
}

fn header(line: &[u8]) -> Option<(i32, Option<Health>)> {
    let mut words = std::str::from_utf8(line).ok()?.strip_prefix("tenure-candidate ")?.split(' ');
    let priority = words.next()?.parse().ok()?;
    let health = words.find_map(|w| match w {
        "health=passing" => Some(Health::Passing),
        "health=failing" => Some(Health::Failing),
        _ => None,
    });
    Some((priority, health))
}

/// `presence` (as [`encode`] wrote it) with `health` in place of what it said before.
pub(crate) fn with_health(presence: &[u8], health: Health) -> Vec<u8> {
    let nl = presence.iter().position(|&b| b == b'\n').unwrap_or(presence.len());
    let priority = header(&presence[..nl]).map(|(p, _)| p).unwrap_or_default();
    encode(priority, Some(health), presence.get(nl + 1..).unwrap_or_default())
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_names_are_valid_for_any_election_and_holder() {
        let long = ElectionName::new("a/".repeat(99) + "b").unwrap();
        let holder = HolderId::new("x".repeat(200)).unwrap();
        let n = name(&long, &holder);
        assert!(n.as_str().starts_with(&prefix(&long)) && n.as_str().starts_with(RESERVED_PREFIX));
        assert_ne!(name(&long, &HolderId::new("y").unwrap()), n, "each candidate has its own");
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c, "the hash is FNV-1a (names must not change between releases)");
    }

    #[test]
    fn the_priority_and_metadata_round_trip_and_long_metadata_is_cut() {
        let rec = |metadata: Vec<u8>| LeaseRecord {
            election: ElectionName::new("e").unwrap(),
            holder: HolderId::new("h").unwrap(),
            token: crate::FencingToken(1),
            revision: crate::store::Revision(1),
            ttl: Duration::from_secs(1),
            acquired_at: None,
            renewed_at: None,
            remaining: None,
            evicted: false,
            metadata,
        };
        let c = candidate(&rec(encode(-3, None, b"10.0.0.7:8080\n"))).unwrap();
        assert_eq!((c.priority, c.health, c.metadata.as_slice()), (-3, None, &b"10.0.0.7:8080\n"[..]));
        let failing = with_health(&encode(-3, None, b"10.0.0.7:8080\n"), Health::Failing);
        let c = candidate(&rec(failing.clone())).unwrap();
        assert_eq!((c.priority, c.health, c.metadata.as_slice()), (-3, Some(Health::Failing), &b"10.0.0.7:8080\n"[..]));
        let c = candidate(&rec(with_health(&failing, Health::Passing))).unwrap();
        assert_eq!((c.priority, c.health), (-3, Some(Health::Passing)));
        let big = encode(7, None, &vec![b'x'; MAX_METADATA]);
        assert_eq!(big.len(), MAX_METADATA);
        assert_eq!(candidate(&rec(big)).unwrap().priority, 7);
        assert_eq!(candidate(&rec(b"not a presence".to_vec())), None);
    }
}
