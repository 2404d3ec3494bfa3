//! A checker for recorded histories: the invariants I1–I4 of the design, per election.
//!
//! Record what the candidates and the fenced resource did, every instant on one
//! monotonic clock (nanoseconds from any origin), then call [`check`]. It sorts once per
//! election and sweeps, so it runs in O(n log n), and reports every violation with the
//! records that make it.

use std::collections::BTreeMap;
use std::fmt;

/// One recorded fact. Times are nanoseconds on one monotonic clock; each variant's
/// fields are described in its own doc line.
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The store granted `token` to `holder` (a new grant, not a renewal); the request
    /// was sent at `requested` and the answer arrived at `completed`.
    Grant { election: String, holder: String, token: u64, requested: u64, completed: u64 },
    /// `holder` believed it led with `token` at this instant (it checked
    /// `Leadership::is_valid()` and got true).
    Belief { election: String, holder: String, token: u64, at: u64 },
    /// The fenced resource answered a write carrying `token`.
    Write { election: String, token: u64, at: u64, accepted: bool },
    /// The leader `holder` stopped at `at`: crashed (`graceful: false`) or stopped cleanly.
    Stop { election: String, holder: String, at: u64, graceful: bool },
    /// `holder` was elected with `token` at `at` (leadership handed to its work).
    Elected { election: String, holder: String, token: u64, at: u64 },
    /// The store refused writes (a failover, a read-only server) for longer than a TTL,
    /// so every leader stepped down, and served again from `at`: some candidate, any
    /// one, must be elected within the crash bound.
    Recovered { election: String, at: u64 },
    /// `holder`'s work was frozen (a pause between its check and its write) from `from`
    /// until `until`: it could not campaign before its work came back, so a takeover by
    /// it is timed from `until` if that is later than the stop.
    Paused { election: String, holder: String, from: u64, until: u64 },
}

/// Bounds for the liveness check (I4).
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    /// After a crash, a new leader must be elected within this many nanoseconds
    /// (TTL + one store round trip + a small constant).
    pub after_crash: u64,
    /// After a graceful stop, within this many nanoseconds (a few round trips).
    pub after_stop: u64,
    /// Stops after this instant are not checked (the history ends before the bound could be met).
    pub until: u64,
}

/// Which invariant a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// Two holders believed they led at overlapping times.
    I1OneHolder,
    /// A later grant did not get a larger token, or a token was granted twice.
    I2FencesIncrease,
    /// The fenced resource accepted a token lower than one it had accepted.
    I3StaleWriteRejected,
    /// No new leader within the bound after a leader stopped.
    I4Liveness,
    /// More terms believed they held an election with N holders than N, at one time.
    I7AtMostN,
}

/// A broken invariant, with the records that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: Invariant,
    /// The election.
    pub election: String,
    /// What happened, in words.
    pub detail: String,
    /// The records involved.
    pub records: Vec<Record>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in {}: {}", self.invariant, self.election, self.detail)?;
        for r in &self.records {
            write!(f, "\n    {r:?}")?;
        }
        Ok(())
    }
}

/// What the checker saw, besides violations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Every violation found.
    pub violations: Vec<Violation>,
    /// Distinct terms (holder, token) that believed they led.
    pub terms: usize,
    /// Writes the fenced resource rejected as stale.
    pub stale_writes_rejected: usize,
    /// Writes accepted.
    pub writes_accepted: usize,
    /// Time from each crash to the next election, in nanoseconds.
    pub takeovers_after_crash: Vec<u64>,
    /// Time from each graceful stop to the next election, in nanoseconds.
    pub handovers_after_stop: Vec<u64>,
    /// Time from each end of a store outage ([`Record::Recovered`]) to the next election.
    pub elections_after_recovery: Vec<u64>,
}

fn election_of(r: &Record) -> &str {
    match r {
        Record::Grant { election, .. }
        | Record::Belief { election, .. }
        | Record::Write { election, .. }
        | Record::Stop { election, .. }
        | Record::Elected { election, .. }
        | Record::Recovered { election, .. }
        | Record::Paused { election, .. } => election,
    }
}

/// Checks I1–I3, and I4 if `liveness` is given, for every election in `records`.
pub fn check(records: &[Record], liveness: Option<Liveness>) -> Summary {
    let mut by_election: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records {
        by_election.entry(election_of(r)).or_default().push(r);
    }
    let mut s = Summary::default();
    for (election, recs) in by_election {
        check_one_holder(election, &recs, &mut s);
        check_fences(election, &recs, &mut s);
        check_writes(election, &recs, &mut s);
        if let Some(l) = liveness {
            check_liveness(election, &recs, l, &mut s);
        }
    }
    s
}

/// A term: (holder, token).
type TermKey<'a> = (&'a str, u64);
/// A span of time: (from, to).
type Span = (u64, u64);

/// I1: the belief span of each term, [first belief, last belief], overlaps no other term's.
/// I7: of the elections whose names start with `prefix` (one per holder index of an
/// election with `n` holders), never more than `n` terms believed they held at once. Each
/// term spans its first belief to its last.
pub fn check_at_most(records: &[Record], prefix: &str, n: usize) -> Vec<Violation> {
    let mut spans: BTreeMap<(&str, &str, u64), (u64, u64)> = BTreeMap::new();
    for r in records {
        if let Record::Belief { election, holder, token, at } = r
            && election.starts_with(prefix)
        {
            let e = spans.entry((election.as_str(), holder.as_str(), *token)).or_insert((*at, *at));
            e.0 = e.0.min(*at);
            e.1 = e.1.max(*at);
        }
    }
    let mut out = Vec::new();
    for (term, span) in &spans {
        let at_once: Vec<_> = spans.iter().filter(|(_, s)| s.0 <= span.0 && span.0 <= s.1).collect();
        if at_once.len() > n {
            out.push(Violation {
                invariant: Invariant::I7AtMostN,
                election: prefix.to_string(),
                detail: format!(
                    "{} terms believed they held at {} (at most {n} may), when {} (token {}) began: {:?}",
                    at_once.len(),
                    span.0,
                    term.1,
                    term.2,
                    at_once.iter().map(|(t, _)| (t.1, t.2)).collect::<Vec<_>>()
                ),
                records: at_once
                    .iter()
                    .map(|(t, s)| Record::Belief { election: t.0.into(), holder: t.1.into(), token: t.2, at: s.0 })
                    .collect(),
            });
            break;
        }
    }
    out
}

fn check_one_holder(election: &str, recs: &[&Record], s: &mut Summary) {
    let mut spans: BTreeMap<(&str, u64), (u64, u64)> = BTreeMap::new();
    for r in recs {
        if let Record::Belief { holder, token, at, .. } = r {
            let e = spans.entry((holder.as_str(), *token)).or_insert((*at, *at));
            e.0 = e.0.min(*at);
            e.1 = e.1.max(*at);
        }
    }
    s.terms += spans.len();
    let mut list: Vec<_> = spans.into_iter().collect();
    list.sort_by_key(|(_, (from, _))| *from);
    // Sweep: the term whose span reaches furthest so far.
    let mut reach: Option<(TermKey, Span)> = None;
    for (term, span) in list {
        if let Some((prev, pspan)) = reach {
            if span.0 <= pspan.1 {
                s.violations.push(Violation {
                    invariant: Invariant::I1OneHolder,
                    election: election.to_string(),
                    detail: format!(
                        "{} (token {}) believed it led from {} to {} while {} (token {}) believed so from {} to {}",
                        term.0, term.1, span.0, span.1, prev.0, prev.1, pspan.0, pspan.1
                    ),
                    records: vec![
                        Record::Belief { election: election.into(), holder: prev.0.into(), token: prev.1, at: pspan.1 },
                        Record::Belief { election: election.into(), holder: term.0.into(), token: term.1, at: span.0 },
                    ],
                });
            }
            if span.1 > pspan.1 {
                reach = Some((term, span));
            }
        } else {
            reach = Some((term, span));
        }
    }
}

/// I2: a grant that completed before another was requested has the smaller token; no
/// token is granted twice.
fn check_fences(election: &str, recs: &[&Record], s: &mut Summary) {
    let mut grants: Vec<(&str, u64, u64, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Grant { holder, token, requested, completed, .. } => {
                Some((holder.as_str(), *token, *requested, *completed))
            }
            _ => None,
        })
        .collect();
    let grant_record = |g: &(&str, u64, u64, u64)| Record::Grant {
        election: election.into(),
        holder: g.0.into(),
        token: g.1,
        requested: g.2,
        completed: g.3,
    };
    let mut seen: BTreeMap<u64, (&str, u64, u64, u64)> = BTreeMap::new();
    for g in &grants {
        if let Some(prev) = seen.insert(g.1, *g) {
            s.violations.push(Violation {
                invariant: Invariant::I2FencesIncrease,
                election: election.into(),
                detail: format!("token {} was granted twice", g.1),
                records: vec![grant_record(&prev), grant_record(g)],
            });
        }
    }
    // Sorted by request time, every grant's token must exceed the largest token of the
    // grants that completed before it was requested.
    grants.sort_by_key(|g| g.2);
    let mut by_completion = grants.clone();
    by_completion.sort_by_key(|g| g.3);
    let mut i = 0;
    let mut best: Option<(&str, u64, u64, u64)> = None;
    for g in &grants {
        while i < by_completion.len() && by_completion[i].3 < g.2 {
            if best.is_none_or(|b| by_completion[i].1 > b.1) {
                best = Some(by_completion[i]);
            }
            i += 1;
        }
        if let Some(b) = best
            && b.1 >= g.1
        {
            s.violations.push(Violation {
                invariant: Invariant::I2FencesIncrease,
                election: election.into(),
                detail: format!("token {} was granted after token {} had been granted, but is not larger", g.1, b.1),
                records: vec![grant_record(&b), grant_record(g)],
            });
        }
    }
}

/// I3: in time order, no accepted write carries a token below one accepted before.
fn check_writes(election: &str, recs: &[&Record], s: &mut Summary) {
    let mut writes: Vec<(u64, u64, bool)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Write { token, at, accepted, .. } => Some((*at, *token, *accepted)),
            _ => None,
        })
        .collect();
    writes.sort();
    let mut highest: Option<(u64, u64)> = None;
    for (at, token, accepted) in writes {
        if !accepted {
            s.stale_writes_rejected += 1;
            continue;
        }
        s.writes_accepted += 1;
        if let Some((hat, htok)) = highest
            && token < htok
        {
            s.violations.push(Violation {
                invariant: Invariant::I3StaleWriteRejected,
                election: election.into(),
                detail: format!("a write with token {token} was accepted after token {htok}"),
                records: vec![
                    Record::Write { election: election.into(), token: htok, at: hat, accepted: true },
                    Record::Write { election: election.into(), token, at, accepted: true },
                ],
            });
        }
        if highest.is_none_or(|(_, h)| token >= h) {
            highest = Some((at, token));
        }
    }
}

/// I4: after each stop of the current leader, someone else is granted the lease or
/// elected within the bound.
fn check_liveness(election: &str, recs: &[&Record], l: Liveness, s: &mut Summary) {
    let mut elections: Vec<(u64, &str, u64)> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Elected { holder, at, token, .. } => Some((*at, holder.as_str(), *token)),
            // A grant is a takeover even if its holder dies before it is elected.
            Record::Grant { holder, completed, token, .. } => Some((*completed, holder.as_str(), *token)),
            _ => None,
        })
        .collect();
    elections.sort();
    for r in recs {
        if let Record::Recovered { at, .. } = r {
            let i = elections.partition_point(|(t, _, _)| *t < *at);
            match elections.get(i) {
                Some((t, _, _)) if t - at <= l.after_crash => s.elections_after_recovery.push(t - at),
                _ if at + l.after_crash > l.until => {}
                found => s.violations.push(Violation {
                    invariant: Invariant::I4Liveness,
                    election: election.into(),
                    detail: match found {
                        Some((t, h, _)) => format!(
                            "{h} was elected {} ns after the store served again; the bound is {} ns",
                            t - at,
                            l.after_crash
                        ),
                        None => "nobody was elected after the store served again".into(),
                    },
                    records: vec![(*r).clone()],
                }),
            }
            continue;
        }
        let Record::Stop { holder, at, graceful, .. } = r else {
            continue;
        };
        let bound = if *graceful { l.after_stop } else { l.after_crash };
        // Another holder elected after the stopping holder's last election counts, even
        // if it came before the stop was recorded (the old term had already expired).
        let (term_start, term_token) = elections
            .iter()
            .take_while(|(t, _, _)| *t <= *at)
            .filter(|(_, h, _)| *h == holder.as_str())
            .last()
            .map_or((0, None), |(t, _, k)| (*t, Some(*k)));
        let i = elections.partition_point(|(t, _, _)| *t <= term_start);
        // Another holder counts, and so does a new term of the stopping holder after the
        // stop (a candidate cut off, healed and elected again: the election has a leader).
        let found = elections[i..]
            .iter()
            .find(|(t, h, k)| *h != holder.as_str() || (*t > *at && Some(*k) != term_token))
            .map(|(t, h, _)| (*t, *h));
        // A winner whose work was frozen when the leader stopped could not campaign
        // before it came back: its takeover is timed from then.
        let from = found.map_or(*at, |(_, h)| {
            recs.iter()
                .filter_map(|r| match r {
                    Record::Paused { holder: p, from, until, .. } if p == h && *from <= *at && *until > *at => {
                        Some(*until)
                    }
                    _ => None,
                })
                .max()
                .unwrap_or(*at)
        });
        match found {
            Some((t, _)) if t.saturating_sub(from) <= bound => {
                let took = t.saturating_sub(from);
                if *graceful {
                    s.handovers_after_stop.push(took);
                } else {
                    s.takeovers_after_crash.push(took);
                }
            }
            found => {
                if *at + bound > l.until {
                    continue;
                }
                s.violations.push(Violation {
                    invariant: Invariant::I4Liveness,
                    election: election.into(),
                    detail: match found {
                        Some((t, h)) => format!(
                            "{h} was elected {} ns after {holder} stopped; the bound is {bound} ns",
                            t.saturating_sub(*at)
                        ),
                        None => format!("nobody was elected after {holder} stopped"),
                    },
                    records: vec![(*r).clone()],
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn belief(h: &str, token: u64, at: u64) -> Record {
        Record::Belief { election: "e".into(), holder: h.into(), token, at }
    }
    fn grant(h: &str, token: u64, requested: u64, completed: u64) -> Record {
        Record::Grant { election: "e".into(), holder: h.into(), token, requested, completed }
    }
    fn write(token: u64, at: u64, accepted: bool) -> Record {
        Record::Write { election: "e".into(), token, at, accepted }
    }
    fn invariants(s: &Summary) -> Vec<Invariant> {
        s.violations.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_history_passes() {
        let h = vec![
            grant("a", 1, 0, 5),
            Record::Elected { election: "e".into(), holder: "a".into(), token: 1, at: 6 },
            belief("a", 1, 10),
            write(1, 11, true),
            belief("a", 1, 50),
            Record::Stop { election: "e".into(), holder: "a".into(), at: 60, graceful: false },
            grant("b", 2, 55, 100),
            Record::Elected { election: "e".into(), holder: "b".into(), token: 2, at: 101 },
            belief("b", 2, 110),
            write(2, 111, true),
            write(1, 112, false),
        ];
        let s = check(&h, Some(Liveness { after_crash: 100, after_stop: 10, until: 1000 }));
        assert!(s.violations.is_empty(), "{:?}", s.violations);
        assert_eq!((s.terms, s.writes_accepted, s.stale_writes_rejected), (2, 2, 1));
        assert_eq!(s.takeovers_after_crash, vec![40], "counted from the grant");
    }

    #[test]
    fn overlapping_beliefs_break_i1() {
        let h = vec![belief("a", 1, 10), belief("a", 1, 50), belief("b", 2, 40), belief("b", 2, 90)];
        let s = check(&h, None);
        assert_eq!(invariants(&s), vec![Invariant::I1OneHolder]);
        assert!(s.violations[0].detail.contains("b (token 2)"), "{}", s.violations[0]);
    }

    #[test]
    fn a_term_nested_inside_another_breaks_i1() {
        let h =
            vec![belief("a", 1, 0), belief("a", 1, 100), belief("b", 2, 20), belief("b", 2, 30), belief("c", 3, 60)];
        let s = check(&h, None);
        assert_eq!(invariants(&s), vec![Invariant::I1OneHolder, Invariant::I1OneHolder]);
    }

    #[test]
    fn a_repeated_or_smaller_token_breaks_i2() {
        let twice = check(&[grant("a", 1, 0, 5), grant("b", 1, 10, 15)], None);
        assert!(invariants(&twice).contains(&Invariant::I2FencesIncrease));
        let smaller = check(&[grant("a", 5, 0, 5), grant("b", 3, 10, 15)], None);
        assert_eq!(invariants(&smaller), vec![Invariant::I2FencesIncrease]);
        // Concurrent requests may complete in either order: not a violation.
        let concurrent = check(&[grant("a", 5, 0, 20), grant("b", 3, 10, 15)], None);
        assert!(concurrent.violations.is_empty());
    }

    #[test]
    fn an_accepted_stale_write_breaks_i3() {
        let s = check(&[write(2, 10, true), write(1, 20, true)], None);
        assert_eq!(invariants(&s), vec![Invariant::I3StaleWriteRejected]);
    }

    #[test]
    fn a_slow_takeover_breaks_i4() {
        let l = Liveness { after_crash: 100, after_stop: 10, until: 10_000 };
        let h = vec![
            Record::Stop { election: "e".into(), holder: "a".into(), at: 0, graceful: true },
            Record::Elected { election: "e".into(), holder: "b".into(), token: 2, at: 50 },
        ];
        assert_eq!(invariants(&check(&h, Some(l))), vec![Invariant::I4Liveness]);
        let none = vec![Record::Stop { election: "e".into(), holder: "a".into(), at: 0, graceful: false }];
        assert_eq!(invariants(&check(&none, Some(l))), vec![Invariant::I4Liveness]);
        // A successor elected before the stop was recorded (the old term had run out
        // while its work was still stopping) satisfies liveness.
        let early = vec![
            Record::Elected { election: "e".into(), holder: "a".into(), token: 1, at: 0 },
            Record::Elected { election: "e".into(), holder: "b".into(), token: 2, at: 500 },
            Record::Stop { election: "e".into(), holder: "a".into(), at: 700, graceful: true },
        ];
        assert!(check(&early, Some(l)).violations.is_empty());
        // A stop too close to the end of the history is not judged.
        let late = vec![Record::Stop { election: "e".into(), holder: "a".into(), at: 9_950, graceful: false }];
        assert!(check(&late, Some(l)).violations.is_empty());
        // After a store outage any candidate, the old leader too, must be elected in time.
        let recovered = |at| Record::Recovered { election: "e".into(), at };
        let same =
            vec![recovered(1_000), Record::Elected { election: "e".into(), holder: "a".into(), token: 3, at: 1_050 }];
        assert!(check(&same, Some(l)).violations.is_empty());
        assert_eq!(invariants(&check(&[recovered(1_000)], Some(l))), vec![Invariant::I4Liveness]);
        let slow =
            vec![recovered(1_000), Record::Elected { election: "e".into(), holder: "a".into(), token: 3, at: 9_000 }];
        assert_eq!(invariants(&check(&slow, Some(l))), vec![Invariant::I4Liveness]);
        // A leader cut off (a stop) that heals and is elected again, with a new token,
        // within the bound: the election had a leader. Its old term's work starting late
        // (the same token) does not count.
        let elected =
            |holder: &str, token, at| Record::Elected { election: "e".into(), holder: holder.into(), token, at };
        let cut = Record::Stop { election: "e".into(), holder: "a".into(), at: 1_000, graceful: false };
        let healed = vec![elected("a", 1, 0), cut.clone(), elected("a", 4, 1_060), elected("b", 5, 5_000)];
        assert!(check(&healed, Some(l)).violations.is_empty(), "{:?}", check(&healed, Some(l)).violations);
        let same_term = vec![elected("a", 1, 0), cut, elected("a", 1, 1_060), elected("b", 5, 5_000)];
        assert_eq!(invariants(&check(&same_term, Some(l))), vec![Invariant::I4Liveness]);
    }

    #[test]
    fn a_winner_whose_work_was_frozen_is_timed_from_its_return() {
        let l = Liveness { after_crash: 100, after_stop: 10, until: 10_000 };
        let stop = Record::Stop { election: "e".into(), holder: "a".into(), at: 1_000, graceful: false };
        let won = Record::Elected { election: "e".into(), holder: "b".into(), token: 2, at: 3_050 };
        let paused =
            |holder: &str, from, until| Record::Paused { election: "e".into(), holder: holder.into(), from, until };
        assert_eq!(invariants(&check(&[stop.clone(), won.clone()], Some(l))), vec![Invariant::I4Liveness]);
        let frozen = vec![stop.clone(), paused("b", 900, 3_000), won.clone()];
        assert!(check(&frozen, Some(l)).violations.is_empty(), "b could not campaign before 3,000");
        // Another candidate's pause, or one that ended before the stop, excuses nothing.
        let other = vec![stop.clone(), paused("c", 900, 3_000), won.clone()];
        assert_eq!(invariants(&check(&other, Some(l))), vec![Invariant::I4Liveness]);
        let before = vec![stop, paused("b", 100, 900), won];
        assert_eq!(invariants(&check(&before, Some(l))), vec![Invariant::I4Liveness]);
    }

    #[test]
    fn elections_are_checked_apart() {
        let h = vec![
            Record::Belief { election: "x".into(), holder: "a".into(), token: 1, at: 10 },
            Record::Belief { election: "y".into(), holder: "b".into(), token: 1, at: 10 },
        ];
        assert!(check(&h, None).violations.is_empty());
    }
}
