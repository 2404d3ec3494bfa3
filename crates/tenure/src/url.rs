//! Small helpers for store URLs, shared by the store crates.

use crate::store::StoreError;

/// Splits the query parameters named in `ours` off `url`: returns the URL without them
/// (for the client library, which may refuse parameters it does not know) and the values
/// found, in the order of `ours` (`None` if absent; the last occurrence wins).
pub fn take_params(url: &str, ours: &[&str]) -> (String, Vec<Option<String>>) {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut found = vec![None; ours.len()];
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match ours.iter().position(|o| *o == k) {
            Some(i) => found[i] = Some(v.to_string()),
            None => rest.push(pair),
        }
    }
    let url = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
    (url, found)
}

/// Checks a table name that will be written into SQL: 1 to `max` lowercase letters,
/// digits and underscores, not starting with a digit. Nothing else can reach the statement
/// text, and lowercase names mean the same thing quoted or not, on every server.
pub fn check_table_name(name: &str, max: usize) -> Result<(), StoreError> {
    let valid = !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "table name {name:?} is not allowed: use 1 to {max} lowercase letters, digits and underscores, not starting with a digit"
        )))
    }
}

/// A URL with its password replaced by `***`, safe to print: `scheme://user:***@host…`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_parameters_come_off_the_rest_stays() {
        let (url, v) = take_params("postgres://u:p@h/db?sslmode=require&table=t1&x=1&table=t2", &["table", "prefix"]);
        assert_eq!(url, "postgres://u:p@h/db?sslmode=require&x=1");
        assert_eq!(v, vec![Some("t2".to_string()), None]);
        assert_eq!(take_params("redis://h", &["prefix"]), ("redis://h".to_string(), vec![None]));
    }

    #[test]
    fn table_names_are_checked() {
        assert!(check_table_name("tenure_leases", 63).is_ok());
        for bad in ["", "1t", "a-b", "a;drop", "Leases", &"x".repeat(64)] {
            assert!(check_table_name(bad, 63).is_err(), "{bad}");
        }
    }
}
