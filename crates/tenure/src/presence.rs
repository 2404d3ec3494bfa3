//! Candidates that announce themselves, so that operators and programs can list them
//! beside the leader (Curator's `getParticipants`).
//!
//! A candidate with [`Config::announce`](crate::Config::announce) holds a *presence
//! lease* of its own, uncontested, under [`RESERVED_PREFIX`]: the holder id, its
//! priority and metadata, renewed like any lease and expiring on its own a TTL after
//! the candidate stops renewing it. It costs one store call per renew interval per
//! candidate (through [`Batched`](crate::Batched), a share of one). Nothing about the
//! election itself depends on it.

use std::time::{Duration, SystemTime};

use crate::name::{ElectionName, HolderId};
use crate::record::{LeaseRecord, MAX_METADATA};
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
    /// When it last renewed its presence, where the store keeps the time.
    pub seen_at: Option<SystemTime>,
    /// How long its presence lasts without another renewal, where the store knows.
    pub expires_in: Option<Duration>,
}

/// The live candidates of `election` that announce themselves, by holder id.
pub async fn candidates(store: &dyn LeaseStore, election: &ElectionName) -> Result<Vec<Candidate>, StoreError> {
    let mut out: Vec<Candidate> = store.list(&prefix(election)).await?.iter().filter_map(candidate).collect();
    out.sort_by(|a, b| a.holder.cmp(&b.holder));
    Ok(out)
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

/// What a presence lease publishes: `tenure-candidate PRIORITY\n`, then the metadata.
pub(crate) fn encode(priority: i32, metadata: &[u8]) -> Vec<u8> {
    let mut v = format!("tenure-candidate {priority}\n").into_bytes();
    let room = MAX_METADATA - v.len();
    v.extend_from_slice(&metadata[..metadata.len().min(room)]);
    v
}

fn candidate(rec: &LeaseRecord) -> Option<Candidate> {
    if rec.evicted {
        return None;
    }
    let nl = rec.metadata.iter().position(|&b| b == b'\n')?;
    let header = std::str::from_utf8(&rec.metadata[..nl]).ok()?;
    let priority = header.strip_prefix("tenure-candidate ")?.parse().ok()?;
    Some(Candidate {
        holder: rec.holder.clone(),
        priority,
        metadata: rec.metadata[nl + 1..].to_vec(),
        seen_at: rec.renewed_at.or(rec.acquired_at),
        expires_in: rec.remaining,
    })
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
        let c = candidate(&rec(encode(-3, b"10.0.0.7:8080\n"))).unwrap();
        assert_eq!((c.priority, c.metadata.as_slice()), (-3, &b"10.0.0.7:8080\n"[..]));
        let big = encode(7, &vec![b'x'; MAX_METADATA]);
        assert_eq!(big.len(), MAX_METADATA);
        assert_eq!(candidate(&rec(big)).unwrap().priority, 7);
        assert_eq!(candidate(&rec(b"not a presence".to_vec())), None);
    }
}
