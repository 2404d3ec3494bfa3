//! Schedules for `tenure schedule`: `--every DURATION` or a five-field cron expression (UTC).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};

/// When to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// At every multiple of this period since the Unix epoch (so replicas agree on ticks).
    Every(Duration),
    /// A cron expression, evaluated in UTC.
    Cron(Box<Cron>),
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Every(d) => write!(f, "every {}", humantime::format_duration(*d)),
            Schedule::Cron(c) => write!(f, "cron {:?} (UTC)", c.source),
        }
    }
}

impl Schedule {
    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let since = t.duration_since(UNIX_EPOCH).ok()?;
        match self {
            Schedule::Every(p) => {
                let p = p.as_millis().max(1);
                let n = since.as_millis() / p + 1;
                Some(UNIX_EPOCH + Duration::from_millis((n * p) as u64))
            }
            Schedule::Cron(c) => c.next_after(since.as_secs()).map(|s| UNIX_EPOCH + Duration::from_secs(s)),
        }
    }
}

/// A parsed five-field cron expression: minute hour day-of-month month day-of-week.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    source: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_any: bool,
    weekdays_any: bool,
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Cron {
    /// Parses `expr` (also `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`).
    pub fn parse(expr: &str) -> Result<Self> {
        let source = expr.trim().to_string();
        let expanded = match source.as_str() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            s => s,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            bail!(
                "cron expression {source:?} has {} fields; it needs five: minute hour day-of-month month day-of-week (e.g. \"0 3 * * *\")",
                fields.len()
            );
        }
        let weekdays = field(fields[4], 0, 7, &WEEKDAYS, "day-of-week")?;
        // 7 is Sunday too.
        let weekdays = (weekdays | (weekdays >> 7)) & 0x7f;
        Ok(Self {
            minutes: field(fields[0], 0, 59, &[], "minute")?,
            hours: field(fields[1], 0, 23, &[], "hour")?,
            days: field(fields[2], 1, 31, &[], "day-of-month")?,
            months: field(fields[3], 1, 12, &MONTHS, "month")?,
            weekdays,
            days_any: fields[2] == "*",
            weekdays_any: fields[4] == "*",
            source,
        })
    }

    pub(crate) fn matches(&self, secs: u64) -> bool {
        let days = secs / 86_400;
        let (_, month, day) = civil_from_days(days as i64);
        let rem = secs % 86_400;
        let weekday = (days + 4) % 7; // 1970-01-01 was a Thursday
        let day_ok = match (self.days_any, self.weekdays_any) {
            (true, true) => true,
            (false, true) => bit(self.days, day),
            (true, false) => bit(self.weekdays, weekday),
            (false, false) => bit(self.days, day) || bit(self.weekdays, weekday),
        };
        day_ok && bit(self.months, month) && bit(self.hours, rem / 3600) && bit(self.minutes, rem % 3600 / 60)
    }

    /// The first matching minute strictly after `secs` (Unix seconds), within five years.
    fn next_after(&self, secs: u64) -> Option<u64> {
        let mut t = (secs / 60 + 1) * 60;
        let end = t + 5 * 366 * 86_400;
        while t < end {
            if self.matches(t) {
                return Some(t);
            }
            t += 60;
        }
        None
    }
}

fn bit(mask: u64, n: u64) -> bool {
    mask & (1 << n) != 0
}

fn field(text: &str, lo: u64, hi: u64, names: &[&str], what: &str) -> Result<u64> {
    let value = |s: &str| -> Result<u64> {
        if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(i as u64 + lo);
        }
        match s.parse::<u64>() {
            Ok(v) if (lo..=hi).contains(&v) => Ok(v),
            _ => bail!("cron {what} {s:?} is not a number from {lo} to {hi}"),
        }
    };
    let mut mask = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => match s.parse::<u64>() {
                Ok(s) if s > 0 => (r, s),
                _ => bail!("cron {what} step {s:?} must be a positive number"),
            },
            None => (part, 1),
        };
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            (v, if step > 1 { hi } else { v })
        };
        if a > b {
            bail!("cron {what} range {range:?} runs backwards");
        }
        let mut v = a;
        while v <= b {
            mask |= 1 << v;
            v += step;
        }
    }
    Ok(mask)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u64, u64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn next(expr: &str, from: &str) -> String {
        let c = Schedule::Cron(Box::new(Cron::parse(expr).unwrap()));
        humantime::format_rfc3339_seconds(c.next_after(at(from)).unwrap()).to_string()
    }

    #[test]
    fn cron_next_ticks() {
        assert_eq!(next("0 3 * * *", "2026-11-21T12:00:00Z"), "2026-11-22T03:00:00Z");
        assert_eq!(next("*/15 * * * *", "2026-11-21T12:07:30Z"), "2026-11-21T12:15:00Z");
        assert_eq!(next("0 0 29 2 *", "2026-03-01T00:00:00Z"), "2028-02-29T00:00:00Z");
        assert_eq!(next("30 9 * * mon-fri", "2026-11-21T12:00:00Z"), "2026-11-23T09:30:00Z"); // Sat -> Mon
        assert_eq!(next("0 12 * * 7", "2026-11-21T12:00:00Z"), "2026-11-22T12:00:00Z"); // 7 = Sunday
        assert_eq!(next("0 0 1 jan *", "2026-11-21T12:00:00Z"), "2027-01-01T00:00:00Z");
        assert_eq!(next("@hourly", "2026-11-21T12:00:00Z"), "2026-11-21T13:00:00Z");
        // Day-of-month and day-of-week both set: either matches.
        assert_eq!(next("0 0 25 * sun", "2026-11-21T12:00:00Z"), "2026-11-22T00:00:00Z");
    }

    #[test]
    fn cron_errors_say_what_is_wrong() {
        for (e, why) in [
            ("0 3 * *", "five"),
            ("60 * * * *", "minute \"60\""),
            ("* * * * xyz", "day-of-week"),
            ("*/0 * * * *", "step"),
            ("5-1 * * * *", "backwards"),
        ] {
            let err = Cron::parse(e).unwrap_err().to_string();
            assert!(err.contains(why), "{e}: {err}");
        }
    }

    #[test]
    fn every_ticks_on_shared_boundaries() {
        let s = Schedule::Every(Duration::from_secs(60));
        let t = s.next_after(at("2026-11-21T12:00:10Z")).unwrap();
        assert_eq!(humantime::format_rfc3339_seconds(t).to_string(), "2026-11-21T12:01:00Z");
        assert_eq!(s.next_after(t).unwrap(), t + Duration::from_secs(60));
    }
}
