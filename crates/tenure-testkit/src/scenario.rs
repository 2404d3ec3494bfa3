//! The multi-candidate scenario every server store runs: five real electors, the
//! server's connections killed, the server restarted, the leader cut off; the history
//! is checked for one leader at a time and growing tokens, and the takeover after the
//! leader is cut off is timed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure::Elector;

use crate::faults::{Fault, FaultyStore};
use crate::harness::Harness;
use crate::history::{self, Record};

/// What the scenario measured.
#[derive(Debug)]
pub struct ScenarioReport {
    /// Distinct terms seen.
    pub terms: usize,
    /// Time from cutting the leader off to the next leader's election.
    pub takeover: Duration,
}

/// Runs the scenario with `ttl`; panics on a violation or a takeover slower than
/// `ttl + slack`.
pub async fn multi_candidate(h: &dyn Harness, ttl: Duration, slack: Duration) -> ScenarioReport {
    let election = format!("scenario/{}", crate::unique("multi"));
    let origin = Instant::now();
    let ns = move || origin.elapsed().as_nanos() as u64;
    let records: Arc<Mutex<Vec<Record>>> = Arc::default();
    let mut candidates = Vec::new();
    for i in 0..5 {
        let faulty = FaultyStore::new(h.open().await);
        let elector = Elector::builder(Arc::new(faulty.clone()), &election)
            .holder(format!("cand-{i}"))
            .ttl(ttl)
            .build()
            .expect("a valid config");
        let recs = records.clone();
        let (e, name) = (election.clone(), format!("cand-{i}"));
        let el = elector.clone();
        let task = tokio::spawn(async move {
            let _ = el
                .run_while_leader(|l| {
                    let (recs, e, name) = (recs.clone(), e.clone(), name.clone());
                    async move {
                        recs.lock().unwrap().push(Record::Elected {
                            election: e.clone(),
                            holder: name.clone(),
                            token: l.token().0,
                            at: ns(),
                        });
                        while l.is_valid() {
                            recs.lock().unwrap().push(Record::Belief {
                                election: e.clone(),
                                holder: name.clone(),
                                token: l.token().0,
                                at: ns(),
                            });
                            tokio::select! {
                                _ = l.cancelled() => break,
                                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                            }
                        }
                    }
                })
                .await;
        });
        candidates.push((elector, faulty, task));
    }
    let leader_of = |recs: &[Record]| {
        recs.iter().rev().find_map(|r| match r {
            Record::Elected { holder, token, .. } => Some((holder.clone(), *token)),
            _ => None,
        })
    };
    let wait_leader = |after: usize, within: Duration| {
        let records = records.clone();
        async move {
            let t0 = Instant::now();
            loop {
                {
                    let r = records.lock().unwrap();
                    let elected = r.iter().filter(|x| matches!(x, Record::Elected { .. })).count();
                    if elected > after {
                        return;
                    }
                }
                assert!(t0.elapsed() < within, "no new leader within {within:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    let elected = |records: &Arc<Mutex<Vec<Record>>>| {
        records.lock().unwrap().iter().filter(|x| matches!(x, Record::Elected { .. })).count()
    };

    wait_leader(0, Duration::from_secs(20)).await;
    tokio::time::sleep(ttl).await;
    if h.kill_connections().await {
        tokio::time::sleep(ttl * 2).await;
    }
    if h.restart().await {
        // After the restart a leader must lead again (the old one, or a new one).
        tokio::time::sleep(ttl * 2).await;
    }
    let (leader, _) = leader_of(&records.lock().unwrap()).expect("a leader");
    let before = elected(&records);
    let idx: usize = leader.trim_start_matches("cand-").parse().unwrap();
    candidates[idx].1.set(Fault::Hang);
    let cut = Instant::now();
    wait_leader(before, ttl + slack + Duration::from_secs(5)).await;
    let takeover = cut.elapsed();
    tokio::time::sleep(ttl / 2).await;
    for (e, _, t) in candidates {
        e.shutdown().await;
        let _ = t.await;
    }
    let recs = records.lock().unwrap().clone();
    let s = history::check(&recs, None);
    assert!(s.violations.is_empty(), "violations: {:#?}", s.violations);
    assert!(takeover <= ttl + slack, "takeover took {takeover:?}, more than TTL {ttl:?} + {slack:?}");
    // Tokens of successive elections only grow.
    let tokens: Vec<u64> = recs
        .iter()
        .filter_map(|r| match r {
            Record::Elected { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert!(tokens.windows(2).all(|w| w[0] <= w[1]), "tokens went down: {tokens:?}");
    ScenarioReport { terms: s.terms, takeover }
}

/// The two tests every store on a throwaway server runs, written once: `$conforms`, the
/// conformance suite ([`crate::conformance::run_all`]), and `$scenario`, the
/// five-candidate scenario ([`multi_candidate`]) with a takeover within `ttl + slack`.
/// Each names an expression that gives its `Option<impl Harness>`: `None` when the
/// server is not installed (the launcher has said so; `TENURE_REQUIRE_SERVERS=1` makes
/// that a failure). The calling crate has `tokio` (with its test macros) among its
/// dev-dependencies.
///
/// ```ignore
/// tenure_testkit::store_suite! {
///     conforms: postgres_store_conforms => pg(),
///     scenario: five_candidates_survive_killed_connections_and_a_restart => pg(),
///     ttl: Duration::from_secs(2),
///     slack: Duration::from_millis(500),
/// }
/// ```
#[macro_export]
macro_rules! store_suite {
    (conforms: $conforms:ident => $harness:expr, scenario: $scenario:ident => $scenario_harness:expr, ttl: $ttl:expr, slack: $slack:expr $(,)?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $conforms() {
            let Some(h) = $harness else { return };
            $crate::conformance::run_all(h).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let Some(h) = $scenario_harness else { return };
            let r = $crate::scenario::multi_candidate(&h, $ttl, $slack).await;
            eprintln!(
                "{}: {} terms, takeover {:?} after the leader was cut off",
                stringify!($scenario),
                r.terms,
                r.takeover
            );
        }
    };
}
