//! Fuzz targets for the parsers of what users type: store URLs (as far as they are read
//! before any connection), durations, cron expressions, and the metadata `status` and
//! `list` print. Each takes arbitrary input without panicking, and what it accepts keeps
//! its rule. The number of cases is proptest's (`PROPTEST_CASES`; CI sets it).

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;

use crate::cron::{Cron, Schedule};
use tenure_stores::{Family, STORES, classify};

/// Text shaped like a store URL now and then, anything otherwise.
fn url_like() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(STORES.iter().flat_map(|k| k.schemes.iter().copied()).collect::<Vec<_>>());
    prop_oneof![
        3 => (scheme, "(:|://|:///|//)?", "[ -~]{0,40}").prop_map(|(s, sep, rest)| format!("{s}{sep}{rest}")),
        1 => any::<String>(),
    ]
}

/// Text shaped like a cron expression now and then, anything otherwise.
fn cron_like() -> impl Strategy<Value = String> {
    let field = "(\\*|[0-9]{1,2}|[a-z]{3})(-[0-9a-z]{1,3})?(/[0-9]{1,3})?(,[0-9]{1,2})?";
    let plain = "\\*|[0-9]|[1-5][0-9]|\\*/[1-9]|[0-9]-[1-2][0-9]|[0-9],[1-2][0-9]";
    prop_oneof![
        4 => prop::collection::vec(plain, 5).prop_map(|f| f.join(" ")),
        2 => prop::collection::vec(field, 1..7).prop_map(|f| f.join(" ")),
        1 => "@[a-z]{0,9}",
        1 => any::<String>(),
    ]
}

proptest! {
    #[test]
    fn store_urls_are_checked_before_any_connection_without_panicking(url in url_like()) {
        if let Ok((kind, rest)) = classify(&url) {
            let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
            prop_assert!(kind.schemes.contains(&scheme));
            if kind.family == Family::Sqlite {
                prop_assert!(!rest.strip_prefix("//").unwrap_or(rest).is_empty());
            } else {
                let host = rest.strip_prefix("//");
                prop_assert!(host.is_some_and(|h| !h.is_empty() && !h.starts_with('/')), "{}", url);
            }
        }
    }

    #[test]
    fn durations_are_above_zero_and_at_most_a_day(s in prop_oneof!["[0-9]{0,25}(ns|us|ms|s|m|h|d|w|y|days)?", any::<String>()]) {
        if let Ok(d) = crate::args::positive_duration(&s) {
            prop_assert!(d > Duration::ZERO && d <= Duration::from_secs(86_400), "{} read as {:?}", s, d);
        }
        let _ = crate::args::duration(&s);
    }

    #[test]
    fn metadata_reaches_a_terminal_without_a_control_character(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let shown = crate::inspect::printable(&bytes);
        prop_assert!(!shown.chars().any(|c| c.is_control() || ('\u{2028}'..='\u{202e}').contains(&c) || ('\u{2066}'..='\u{2069}').contains(&c)), "{:?}", shown);
    }

    #[test]
    fn cron_expressions_parse_without_panicking(expr in cron_like()) {
        let _ = Cron::parse(&expr);
    }
}

proptest! {
    // Each case may search five years of minutes: fewer of them.
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn a_cron_schedule_fires_after_the_time_asked_and_on_a_minute_it_names(
        expr in cron_like(),
        at in 0u64..8_000_000_000,
    ) {
        let Ok(cron) = Cron::parse(&expr) else { return Ok(()) };
        let t = UNIX_EPOCH + Duration::from_secs(at);
        let schedule = Schedule::Cron(Box::new(cron.clone()));
        if let Some(next) = schedule.next_after(t) {
            prop_assert!(next > t);
            let secs = next.duration_since(UNIX_EPOCH).unwrap().as_secs();
            prop_assert_eq!(secs % 60, 0);
            prop_assert!(cron.matches(secs), "{} at {}", expr, secs);
            // Nothing it names comes between.
            prop_assert_eq!(schedule.next_after(next - Duration::from_secs(60)), Some(next));
        }
    }
}
