//! Election names and holder ids.

use std::fmt;
use std::sync::Arc;

/// The rule every election name must follow, quoted in errors.
pub const ELECTION_NAME_RULE: &str = "an election name is 1 to 200 characters of A-Z a-z 0-9 . _ - /, \
     with no empty path segment and no '.' or '..' segment (for example \"billing/nightly-report\")";

/// The rule every holder id must follow, quoted in errors.
pub const HOLDER_ID_RULE: &str =
    "a holder id is 1 to 200 characters of A-Z a-z 0-9 . _ - : @ (for example \"web-1.4242.k3j9x2\")";

/// The rule every work key must follow, quoted in errors.
pub const WORK_KEY_RULE: &str = "a work key is 1 to 200 characters of A-Z a-z 0-9 . _ - : + @ =, \
     and not '.' or '..' (for example \"2026-11-27\" or \"slot-1764201600\")";

/// A name was refused: it breaks [`ELECTION_NAME_RULE`] or [`HOLDER_ID_RULE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {problem}; {rule}")]
pub struct NameError {
    what: &'static str,
    value: String,
    problem: String,
    rule: &'static str,
}

/// The name of one election, e.g. `billing/nightly-report`.
///
/// Validated on construction: 1 to 200 characters of `A-Z a-z 0-9 . _ - /`,
/// no empty path segment (so no leading, trailing or doubled `/`), and no `.`
/// or `..` segment.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElectionName(Arc<str>);

impl ElectionName {
    /// Validates `name` and wraps it.
    pub fn new(name: impl AsRef<str>) -> Result<Self, NameError> {
        let name = name.as_ref();
        let err = |problem: String| NameError {
            what: "election name",
            value: truncate(name),
            problem,
            rule: ELECTION_NAME_RULE,
        };
        if name.is_empty() {
            return Err(err("it is empty".into()));
        }
        if name.len() > 200 {
            return Err(err(format!("it is {} characters long", name.chars().count())));
        }
        if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))) {
            return Err(err(format!("it contains {c:?}")));
        }
        for segment in name.split('/') {
            match segment {
                "" => return Err(err("it has an empty path segment".into())),
                "." | ".." => return Err(err(format!("it has a {segment:?} segment"))),
                _ => {}
            }
        }
        Ok(Self(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The identity of one candidate process instance.
///
/// The default, [`HolderId::generate`], is `hostname.pid.<random>`, so a
/// restarted process never inherits the lease of the process it replaces.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId(Arc<str>);

impl HolderId {
    /// Validates `id` and wraps it.
    pub fn new(id: impl AsRef<str>) -> Result<Self, NameError> {
        let id = id.as_ref();
        let err = |problem: String| NameError { what: "holder id", value: truncate(id), problem, rule: HOLDER_ID_RULE };
        if id.is_empty() {
            return Err(err("it is empty".into()));
        }
        if id.len() > 200 {
            return Err(err(format!("it is {} characters long", id.chars().count())));
        }
        if let Some(c) = id.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@'))) {
            return Err(err(format!("it contains {c:?}")));
        }
        Ok(Self(id.into()))
    }

    /// A fresh id for this process instance: `hostname.pid.<8 random characters>`.
    pub fn generate() -> Self {
        let host = host_name();
        let random: String = (0..8).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect();
        Self(format!("{host}.{}.{random}", std::process::id()).into())
    }

    /// The id of one process instance of the candidate named `name`: `name.<8 random
    /// characters>`. Two processes given one name (`--id $(hostname)` on hosts that share
    /// a host name, a copied configuration, a container's pid 1) get different ids, so a
    /// store never takes one's lease for the other's, and a restarted process does not
    /// inherit its predecessor's lease. `name` may be at most [`INSTANCE_NAME_MAX`]
    /// characters, leaving room for the suffix.
    pub fn instance_of(name: &str) -> Result<Self, NameError> {
        Self::new(name)?;
        if name.len() > INSTANCE_NAME_MAX {
            return Err(NameError {
                what: "holder id",
                value: truncate(name),
                problem: format!(
                    "it is {} characters long, and a candidate's name gets 9 more (a '.' and 8 random \
                     characters for its process instance): at most {INSTANCE_NAME_MAX} fit",
                    name.chars().count()
                ),
                rule: HOLDER_ID_RULE,
            });
        }
        let random: String = (0..8).map(|_| fastrand::alphanumeric().to_ascii_lowercase()).collect();
        Self::new(format!("{name}.{random}"))
    }

    /// The name this id was made from by [`HolderId::instance_of`] (or, for a
    /// [generated](HolderId::generate) id, `hostname.pid`): the id without its final
    /// `.` and 8 lowercase letters or digits; `None` for an id without that suffix.
    pub fn instance_name(&self) -> Option<&str> {
        let (name, suffix) = self.0.rsplit_once('.')?;
        let random = suffix.len() == 8 && suffix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        (random && !name.is_empty()).then_some(name)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The longest name [`HolderId::instance_of`] takes: 200 characters less its suffix.
pub const INSTANCE_NAME_MAX: usize = 191;

/// The name of one unit of work within an election: the key of a `--once` run
/// (`2026-11-27`), a schedule slot, a gossip election id. See [`crate::ledger`].
///
/// Validated on construction: 1 to 200 characters of `A-Z a-z 0-9 . _ - : + @ =`, and
/// neither `.` nor `..`, so that it is one path segment in every store.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkKey(Arc<str>);

impl WorkKey {
    /// Validates `key` and wraps it.
    pub fn new(key: impl AsRef<str>) -> Result<Self, NameError> {
        let key = key.as_ref();
        let err = |problem: String| NameError { what: "work key", value: truncate(key), problem, rule: WORK_KEY_RULE };
        if key.is_empty() {
            return Err(err("it is empty".into()));
        }
        if key.len() > 200 {
            return Err(err(format!("it is {} characters long", key.chars().count())));
        }
        if let Some(c) =
            key.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '+' | '@' | '=')))
        {
            return Err(err(format!("it contains {c:?}")));
        }
        if key == "." || key == ".." {
            return Err(err(format!("it is {key:?}")));
        }
        Ok(Self(key.into()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// This machine's host name as it may stand in a holder id: at most 120 characters of
/// A-Z a-z 0-9 - _ (anything else becomes `-`), `host` when it cannot be read.
pub fn host_name() -> String {
    let host: String = hostname()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .take(120)
        .collect();
    if host.is_empty() { "host".to_string() } else { host }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 60 {
        let mut t: String = s.chars().take(60).collect();
        t.push('…');
        t
    } else {
        s.to_string()
    }
}

macro_rules! string_like {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl std::str::FromStr for $t {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
        impl TryFrom<&str> for $t {
            type Error = NameError;
            fn try_from(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
        impl TryFrom<String> for $t {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
    };
}
string_like!(ElectionName);
string_like!(HolderId);
string_like!(WorkKey);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_keys_are_one_path_segment_of_safe_characters() {
        for k in ["2026-11-27", "slot-1764201600", "2026-11-27T03:00:00+00:00", "a.b_c=d@e", &"k".repeat(200)] {
            assert!(WorkKey::new(k).is_ok(), "{k}");
        }
        for (k, why) in
            [("", "empty"), ("a/b", "'/'"), ("a b", "' '"), (".", "\".\""), ("..", "\"..\""), (&"k".repeat(201), "201")]
        {
            let e = WorkKey::new(k).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(WORK_KEY_RULE), "{k:?}: {e}");
        }
    }

    #[test]
    fn accepts_good_names() {
        for n in ["a", "billing/nightly-report", "A.b_c-d/e.f", &"x".repeat(200), "a/.b/c.."] {
            assert!(ElectionName::new(n).is_ok(), "{n}");
        }
    }

    #[test]
    fn refuses_bad_names_quoting_the_rule() {
        for (n, why) in [
            ("", "empty"),
            ("/a", "empty path segment"),
            ("a/", "empty path segment"),
            ("a//b", "empty path segment"),
            ("a/../b", "\"..\" segment"),
            (".", "\".\" segment"),
            ("a b", "' '"),
            ("é", "'é'"),
            (&"x".repeat(201), "201 characters"),
        ] {
            let e = ElectionName::new(n).unwrap_err().to_string();
            assert!(e.contains(why), "{n:?}: {e}");
            assert!(e.contains(ELECTION_NAME_RULE), "{e}");
        }
    }

    #[test]
    fn instances_of_one_name_are_different_ids_that_name_it() {
        let a = HolderId::instance_of("web-1").unwrap();
        let b = HolderId::instance_of("web-1").unwrap();
        assert_ne!(a, b, "two processes given one name");
        assert_eq!((a.instance_name(), b.instance_name()), (Some("web-1"), Some("web-1")));
        assert_eq!(HolderId::new("web-1").unwrap().instance_name(), None);
        assert_eq!(HolderId::new("a.b").unwrap().instance_name(), None);
        assert_eq!(HolderId::new("x.ABCDEFGH").unwrap().instance_name(), None);
        HolderId::instance_of(&"x".repeat(INSTANCE_NAME_MAX)).unwrap();
        let e = HolderId::instance_of(&"x".repeat(INSTANCE_NAME_MAX + 1)).unwrap_err().to_string();
        assert!(e.contains("at most 191 fit"), "{e}");
        assert!(HolderId::instance_of("a b").unwrap_err().to_string().contains("' '"));
        let g = HolderId::generate();
        assert_eq!(g.instance_name(), Some(format!("{}.{}", crate::host_name(), std::process::id()).as_str()));
    }

    #[test]
    fn generated_holder_ids_are_valid_and_unique() {
        let a = HolderId::generate();
        let b = HolderId::generate();
        assert_ne!(a, b);
        HolderId::new(a.as_str()).unwrap();
        assert!(a.as_str().contains(&format!(".{}.", std::process::id())));
    }
}
