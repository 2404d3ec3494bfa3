//! Fuzz targets for every parser of the core that reads user or store input: election
//! names, holder ids, work keys, the value the key-value stores keep, the work ledger's
//! entries, the change feed's payloads, and URL redaction. Each takes arbitrary input
//! without panicking, and what it accepts keeps its rule or comes back as it was written.
//! The number of cases is proptest's (`PROPTEST_CASES`; CI sets it).

use std::time::{Duration, UNIX_EPOCH};

use crate::ledger::{WorkEntry, WorkState};
use crate::store::{Change, StoredValue};
use crate::{ElectionName, FencingToken, HolderId, WorkKey};
use proptest::prelude::*;

/// Text that is mostly the characters names are made of, with anything now and then.
fn name_like() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[A-Za-z0-9._/:@+=-]{0,210}",
        1 => any::<String>(),
        1 => "[./]{0,6}",
    ]
}

proptest! {
    #[test]
    fn names_accept_only_what_their_rules_allow(s in name_like()) {
        if let Ok(n) = ElectionName::new(&s) {
            prop_assert!(!s.is_empty() && s.len() <= 200);
            prop_assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c)));
            prop_assert!(s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != ".."));
            prop_assert_eq!(n.as_str(), s.as_str());
        }
        if let Ok(h) = HolderId::new(&s) {
            prop_assert!(!s.is_empty() && s.len() <= 200);
            prop_assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || "._-:@".contains(c)));
            prop_assert_eq!(h.as_str(), s.as_str());
        }
        match HolderId::instance_of(&s) {
            Ok(h) => {
                prop_assert_eq!(h.instance_name(), Some(s.as_str()));
                prop_assert!(h.as_str().len() <= 200);
            }
            Err(e) => prop_assert!(HolderId::new(&s).is_err() || s.len() > crate::INSTANCE_NAME_MAX, "{}", e),
        }
        if let Ok(k) = WorkKey::new(&s) {
            prop_assert!(!s.is_empty() && s.len() <= 200 && s != "." && s != "..");
            prop_assert!(s.chars().all(|c| c.is_ascii_alphanumeric() || "._-:+@=".contains(c)));
            prop_assert_eq!(k.as_str(), s.as_str());
        }
    }

    #[test]
    fn stored_values_read_back_as_written_and_garbage_is_refused_quietly(
        raw in prop::collection::vec(any::<u8>(), 0..300),
        holder in "[a-z0-9._:@-]{1,40}",
        ttl_ms in 0u64..u64::MAX / 2,
        acquired_ms in any::<u64>(),
        evicted in any::<bool>(),
        token in prop::option::of(any::<u64>()),
        metadata in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let _ = StoredValue::decode(&raw);
        let v = StoredValue {
            holder: HolderId::new(&holder).unwrap(),
            ttl: Duration::from_millis(ttl_ms),
            acquired_ms,
            evicted,
            token,
            metadata,
        };
        prop_assert_eq!(StoredValue::decode(&v.encode()), Some(v));
    }

    #[test]
    fn ledger_entries_read_back_as_written_and_garbage_is_an_error(
        raw in prop::collection::vec(any::<u8>(), 0..200),
        text in "tenure-work/1 [a-z]{0,8} [0-9]{0,22} [0-9]{0,12} [0-9]{0,22} [ -~]{0,30}",
        state in prop_oneof![Just(WorkState::Running), Just(WorkState::Done), Just(WorkState::Failed)],
        token in any::<u64>(),
        attempts in any::<u32>(),
        holder in "[a-z0-9._:@-]{1,40}",
        at_ms in 0u64..4_000_000_000_000,
    ) {
        let _ = WorkEntry::decode(&raw);
        let _ = WorkEntry::decode(text.as_bytes());
        // Times and counts at the ends of their ranges.
        let _ = WorkEntry::decode(format!("tenure-work/1 done {token} {} {} h", u64::MAX, u64::MAX).as_bytes());
        let e = WorkEntry {
            state,
            token: FencingToken(token),
            attempts,
            holder: HolderId::new(&holder).unwrap(),
            at: UNIX_EPOCH + Duration::from_millis(at_ms),
        };
        prop_assert_eq!(WorkEntry::decode(&e.encode()).ok(), Some(e));
    }

    #[test]
    fn change_feed_payloads_never_panic(
        payload in prop_oneof![
            2 => "[a-z/]{1,12}\t[ -~]{0,12}\t[0-9]{0,21}\t[0-9]{0,21}\t[0-9]{0,21}\t-?[0-9]{0,21}\t[0-9]{0,2}\t[0-9]{0,21}\t[0-9]{0,21}\t[0-9a-fA-F]{0,9}",
            1 => any::<String>(),
        ],
    ) {
        let first = payload.split('\t').next().unwrap_or_default();
        match Change::parse(&payload) {
            Change::Everything => prop_assert!(first.is_empty()),
            Change::Election { name, .. } => prop_assert_eq!(&*name, first),
        }
    }

    #[test]
    fn redaction_hides_every_password_whatever_it_holds(
        user in "[a-z]{1,8}",
        password in "[ -~]{1,24}",
        host in "[a-z0-9.]{1,16}",
        scheme in prop_oneof![Just("postgres://"), Just("redis://"), Just("mysql://"), Just("postgres//"), Just("")],
        tail in "(/[a-z0-9]{0,8})?(\\?[a-z]{1,6}=[a-z0-9]{0,6})?",
    ) {
        // `user://rest@host` with no scheme is a URL whose scheme is the user's name and
        // that holds no password: nothing tells the two apart.
        prop_assume!(!(scheme.is_empty() && password.starts_with("//")));
        let url = format!("{scheme}{user}:{password}@{host}{tail}");
        let shown = crate::store::url::redact(&url);
        // A password of three characters or more must not survive: shorter ones may
        // occur in the rest of the URL by chance, and one such as ":**" in the redacted
        // form itself.
        let redacted = format!("{scheme}{user}:***@{host}{tail}");
        if password.len() >= 3 && !redacted.contains(password.as_str()) {
            prop_assert!(!shown.contains(password.as_str()), "{} shown as {}", url, shown);
        }
        // What is taken off is gone from the rest: the client library never sees it.
        if let Ok((rest, _)) = crate::store::url::take_params(&url, &["ca", "cert", "key"]) {
            let query = rest.split_once('?').map_or("", |(_, q)| q);
            let left = query.split('&').map(|p| p.split_once('=').map_or(p, |(k, _)| k));
            prop_assert!(left.into_iter().all(|k| !matches!(k, "ca" | "cert" | "key")), "{} became {}", url, rest);
        }
    }
}
