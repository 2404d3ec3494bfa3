//! Small helpers for store URLs, shared by the store crates.

/// Splits the query parameters named in `ours` off `url`: returns the URL without them
/// (for the client library, which may refuse parameters it does not know) and the values
/// found, in the order of `ours` (`None` if absent). A parameter named twice, ours or the
/// client library's, is an error that names it (not its value, which may be a password):
/// `sslmode=verify-full&sslmode=disable` must not quietly mean the last.
pub fn take_params(url: &str, ours: &[&str]) -> Result<(String, Vec<Option<String>>), String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut found = vec![None; ours.len()];
    let mut rest = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // As client libraries read it (`%73slmode` is `sslmode`, and so is `ssl-mode`).
        if !seen.insert(canonical_key(k)) {
            // A `?` and `@` in the password, unencoded, put a piece of it here: named
            // only when the query is clearly after the host.
            return Err(match query.contains('@') {
                false => format!("parameter {k:?} is given twice; give it once"),
                true => "a parameter is given twice; give each once".to_string(),
            });
        }
        match ours.iter().position(|o| *o == k) {
            Some(i) => found[i] = Some(v.to_string()),
            None => rest.push(pair),
        }
    }
    let url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
    Ok((url, found))
}

/// The setting a query parameter's name stands for, as far as client libraries tell
/// names apart: decoded, in lower case, without `-` and `_` (sqlx reads `ssl-mode` as
/// `sslmode`, `ssl-root-cert` as `sslrootcert`), and PostgreSQL's `ssl-ca` as
/// `sslrootcert`.
fn canonical_key(key: &str) -> Vec<u8> {
    let mut k: Vec<u8> =
        form_decoded(key).into_iter().filter(|b| !matches!(b, b'-' | b'_')).map(|b| b.to_ascii_lowercase()).collect();
    if k == b"sslca" {
        k = b"sslrootcert".to_vec();
    }
    k
}

/// `text` as `application/x-www-form-urlencoded` decodes it: `%XX` escapes and `+` for a
/// space. A malformed escape stays as it is.
fn form_decoded(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// What a PEM file named in a store URL (`ca=`, `cert=`, `key=`) must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pem {
    /// One or more certificates.
    Certificate,
    /// A private key.
    Key,
}

/// Reads the PEM file `path` named by the URL parameter `param`, refusing at once what
/// cannot be one: not a regular file (a FIFO would block the open, a device such as
/// `/dev/zero` would never end), more than 1 MiB, or no PEM block of the `kind` wanted.
pub fn read_pem(param: &str, path: &str, kind: Pem) -> Result<Vec<u8>, crate::StoreError> {
    use crate::{ErrorKind, StoreError};
    const MAX: u64 = 1 << 20;
    let bad = |why: String| StoreError::new(ErrorKind::Misconfigured, format!("{param}={path}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX {
        return Err(bad(format!("{} bytes; a PEM file of certificates or a key is far smaller", meta.len())));
    }
    let bytes = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
    if bytes.len() as u64 > MAX {
        return Err(bad("it grew past 1 MiB while read".into()));
    }
    let text = String::from_utf8_lossy(&bytes);
    let found = match kind {
        Pem::Certificate => text.contains("-----BEGIN CERTIFICATE-----"),
        Pem::Key => text.lines().any(|l| l.starts_with("-----BEGIN ") && l.contains("PRIVATE KEY-----")),
    };
    if !found {
        let what = if kind == Pem::Certificate { "certificate" } else { "private key" };
        return Err(bad(format!("it holds no PEM {what}")));
    }
    Ok(bytes)
}

/// A URL with its passwords replaced by `***`, safe to print: `scheme://user:***@host…`,
/// and any query parameter whose name holds "password". Whatever a password holds (a
/// `/`, `#`, `?` or `@` that should have been percent-encoded), everything between
/// `scheme://user:` and the last `@` is hidden; without `://` after a scheme (a mistyped
/// scheme), everything between the first `:` and the last `@`.
pub fn redact(url: &str) -> String {
    // A scheme is a letter, then letters, digits, `+`, `-` or `.`: a `://` after anything
    // else is inside a password (`postgres//u://pw@h`).
    let scheme_like = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    };
    let Some((scheme, rest)) = url.split_once("://").filter(|(s, _)| scheme_like(s)) else {
        return match (url.find(':'), url.rfind('@')) {
            (Some(colon), Some(at)) if colon < at => format!("{}:***{}", &url[..colon], &url[at..]),
            _ => url.to_string(),
        };
    };
    let (user, after) = match rest.rsplit_once('@') {
        Some((userinfo, after)) => match userinfo.split_once(':') {
            Some((user, _)) => (format!("{user}:***@"), after),
            // No password, unless the user part itself looks like a path (a password with
            // a `/` and no user): hide it all.
            None if userinfo.contains(['/', '?', '#']) => ("***@".to_string(), after),
            None => (format!("{userinfo}@"), after),
        },
        None => (String::new(), rest),
    };
    // A query parameter whose name holds "password" (a sentinel's password) is a secret too.
    let after = match after.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if k.to_ascii_lowercase().contains("password") => format!("{k}=***"),
                    _ => p.to_string(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => after.to_string(),
    };
    format!("{scheme}://{user}{after}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_parameters_come_off_the_rest_stays() {
        let (url, v) = take_params("postgres://u:p@h/db?sslmode=require&table=t1&x=1", &["table", "prefix"]).unwrap();
        assert_eq!(url, "postgres://u:p@h/db?sslmode=require&x=1");
        assert_eq!(v, vec![Some("t1".to_string()), None]);
        assert_eq!(take_params("redis://h", &["prefix"]), Ok(("redis://h".to_string(), vec![None])));
    }

    #[test]
    fn a_parameter_named_twice_is_refused_by_name_alone() {
        for url in [
            "postgres://u:p@h/db?table=t1&x=1&table=t2",
            "postgres://u:p@h/db?sslmode=verify-full&sslmode=disable",
            "redis+sentinel://h/m?sentinel_password=secret1&sentinel_password=secret2",
            "s3://b?region&region=x",
            "postgres://u:p@h/db?sslmode=verify-full&%73slmode=disable",
            "postgres://u:p@h/db?sslmode=verify-full&ssl-mode=disable",
            "postgres://u:p@h/db?sslrootcert=/ca.pem&ssl-ca=/evil.pem",
            "mysql://u:p@h/db?ssl_mode=VERIFY_IDENTITY&ssl-mode=DISABLED",
        ] {
            let e = take_params(url, &["table", "region"]).unwrap_err();
            assert!(e.contains("given twice"), "{url}: {e}");
            assert!(!e.contains("secret") && !e.contains("t2") && !e.contains("disable"), "{url}: {e}");
        }
    }

    #[test]
    fn pem_files_that_cannot_be_one_are_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("tenure-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let cert = file("c.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
        let key = file("k.pem", "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n");
        let empty = file("e.pem", "");
        assert!(read_pem("ca", &cert, Pem::Certificate).is_ok());
        assert!(read_pem("key", &key, Pem::Key).is_ok());
        for (path, kind, says) in [
            ("/dev/zero", Pem::Certificate, "not a regular file"),
            (dir.to_str().unwrap(), Pem::Certificate, "not a regular file"),
            ("/nonexistent/ca.pem", Pem::Certificate, "cannot read it"),
            (empty.as_str(), Pem::Certificate, "no PEM certificate"),
            (key.as_str(), Pem::Certificate, "no PEM certificate"),
            (cert.as_str(), Pem::Key, "no PEM private key"),
        ] {
            let e = read_pem("ca", path, kind).unwrap_err().to_string();
            assert!(e.contains(says), "{path}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_password_holding_a_scheme_separator_is_hidden_under_a_mistyped_scheme() {
        assert_eq!(redact("postgres//a://b@a"), "postgres//a:***@a");
        assert_eq!(redact("postgres://u:x://y@h/db"), "postgres://u:***@h/db");
    }

    #[test]
    fn passwords_are_hidden_in_the_user_part_and_in_parameters() {
        assert_eq!(redact("redis://:pw@h:1/0?prefix=a"), "redis://:***@h:1/0?prefix=a");
        assert_eq!(
            redact("redis+sentinel://:pw@h:1,g:2/m?db=1&sentinel_password=s"),
            "redis+sentinel://:***@h:1,g:2/m?db=1&sentinel_password=***"
        );
        assert_eq!(
            redact("redis+sentinel://h:1/m?sentinel_password=s"),
            "redis+sentinel://h:1/m?sentinel_password=***"
        );
        assert_eq!(redact("etcd://h:1"), "etcd://h:1");
    }

    #[test]
    fn a_password_that_holds_what_a_url_may_not_is_hidden_whole() {
        for (url, shown) in [
            ("postgres://app:a/b@db:5432/x", "postgres://app:***@db:5432/x"),
            ("postgres://app:a#b@db/x", "postgres://app:***@db/x"),
            ("postgres://app:a?b=c@db/x", "postgres://app:***@db/x"),
            ("postgres://app:a@b@db/x", "postgres://app:***@db/x"),
            ("redis://:p/w#?@h:1/0", "redis://:***@h:1/0"),
            ("mysql://u:pw@h/db?password=x", "mysql://u:***@h/db?password=***"),
            ("postgres//u:pw@h/db", "postgres//u:***@h/db"),
            ("postgres:u:p/w@h/db", "postgres:***@h/db"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            ("sqlite:/var/lib/a.db", "sqlite:/var/lib/a.db"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
            for secret in ["pw", "a/b", "a#b", "a?b", "a@b", "p/w"] {
                if url.contains(&format!(":{secret}@")) {
                    assert!(!redact(url).contains(secret), "{url}");
                }
            }
        }
    }
}
