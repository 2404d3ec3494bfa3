//! Property: over any sequence of acquires, renewals, releases, evictions and expiries,
//! every new grant of an election gets a token above all earlier ones, and a renewal
//! keeps its token.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use tenure::store::{Acquire, AcquireRequest, Renew};
use tenure::{ElectionName, Evict, HolderId, LeaseRecord, LeaseStore, MemoryStore};

#[derive(Debug, Clone)]
enum Op {
    Acquire { holder: u8, ttl_ms: u64 },
    Renew { holder: u8 },
    Release { holder: u8 },
    Evict { now: bool },
    Wait { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, 50u64..2000).prop_map(|(holder, ttl_ms)| Op::Acquire { holder, ttl_ms }),
        2 => (0u8..4).prop_map(|holder| Op::Renew { holder }),
        2 => (0u8..4).prop_map(|holder| Op::Release { holder }),
        1 => any::<bool>().prop_map(|now| Op::Evict { now }),
        3 => (0u64..3000).prop_map(|ms| Op::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn tokens_only_grow(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
        rt.block_on(async move {
            let store = MemoryStore::new();
            let e = ElectionName::new("p/e").unwrap();
            let holders: Vec<HolderId> = (0..4).map(|i| HolderId::new(format!("h{i}")).unwrap()).collect();
            let mut leases: HashMap<u8, LeaseRecord> = HashMap::new();
            let mut highest = 0u64;
            for op in ops {
                match op {
                    Op::Acquire { holder, ttl_ms } => {
                        let req = AcquireRequest::new(e.clone(), holders[holder as usize].clone(), Duration::from_millis(ttl_ms));
                        if let Acquire::Acquired(l) = store.try_acquire(&req).await.unwrap() {
                            match leases.get(&holder) {
                                Some(prev) if prev.token == l.token => {
                                    assert_eq!(l.token.0, highest, "a renewal keeps the newest token");
                                }
                                _ => {
                                    assert!(l.token.0 > highest, "new grant {} not above {highest}", l.token);
                                    highest = l.token.0;
                                }
                            }
                            leases.insert(holder, l);
                        }
                    }
                    Op::Renew { holder } => {
                        if let Some(l) = leases.get(&holder).cloned() {
                            match store.renew(&l, Duration::from_millis(500)).await.unwrap() {
                                Renew::Renewed(r) => {
                                    assert_eq!(r.token, l.token);
                                    leases.insert(holder, r);
                                }
                                Renew::Lost(_) => { leases.remove(&holder); }
                            }
                        }
                    }
                    Op::Release { holder } => {
                        if let Some(l) = leases.remove(&holder) {
                            store.release(&l).await.unwrap();
                        }
                    }
                    Op::Evict { now } => {
                        store.evict(&e, if now { Evict::Now } else { Evict::AfterTerm }).await.unwrap();
                    }
                    Op::Wait { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
                }
                if let Some(cur) = store.get(&e).await.unwrap() {
                    assert!(cur.token.0 <= highest);
                }
            }
        });
    }
}
