//! The HTTP client the cloud stores share, the way its failures map onto the store
//! contract's error kinds, and small formatting helpers (dates, hex, URL encoding).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;
use tenure::{ErrorKind, StoreError};

/// Longest wait for one HTTP exchange; the runtime's own request timeout is usually shorter.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A finished HTTP exchange.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// A response header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The first part of the body, for error messages.
    pub fn excerpt(&self) -> String {
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        let mut cut: String = text.chars().take(300).collect();
        if cut.len() < text.len() {
            cut.push('…');
        }
        cut
    }

    /// Whether the body names one of the services' codes for "come back later" that they
    /// send with a status that otherwise means a mistake (S3's `RequestTimeout` is a 400,
    /// GCS's `rateLimitExceeded` can come as a 403), as an XML element or a JSON string.
    fn names_a_passing_refusal(&self) -> bool {
        const CODES: [&str; 8] = [
            "RequestTimeout",
            "SlowDown",
            "Throttling",
            "TooManyRequests",
            "ServerBusy",
            "OperationTimedOut",
            "rateLimitExceeded",
            "userRateLimitExceeded",
        ];
        let text = String::from_utf8_lossy(&self.body);
        CODES.iter().any(|c| text.contains(&format!(">{c}<")) || text.contains(&format!("\"{c}\"")))
    }

    /// An error for a status the caller did not expect: 401/403 are credentials, 408, 429
    /// and 503 (and a "come back later" code in the body) ask to come back later, other
    /// 5xx after a write may have been applied.
    pub fn error(&self, what: &str, writes: bool) -> StoreError {
        let kind = match self.status {
            _ if self.status < 500 && self.names_a_passing_refusal() => ErrorKind::Unavailable,
            401 | 403 => ErrorKind::Unauthorized,
            408 | 429 | 503 => ErrorKind::Unavailable,
            500..=599 if writes => ErrorKind::Ambiguous,
            500..=599 => ErrorKind::Unavailable,
            _ => ErrorKind::Misconfigured,
        };
        let hint = match kind {
            ErrorKind::Unauthorized => "; check the credentials and their permissions",
            _ => "",
        };
        StoreError::new(kind, format!("{what} failed with HTTP {}{hint}: {}", self.status, self.excerpt()))
    }
}

/// How long an idle connection is kept for the next request: below the 5 s after which
/// many servers and proxies (Node's HTTP server among them, so Azurite) close an idle
/// connection, so that a request is not sent on one the server is closing at that
/// moment (it fails with "connection closed before message completed").
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Builds the shared client: rustls, no proxy lookups beyond reqwest's defaults.
pub(crate) fn client() -> Result<reqwest::Client, StoreError> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(POOL_IDLE)
        .build()
        .map_err(|e| StoreError::new(ErrorKind::Misconfigured, "cannot set up the HTTP client").with_source(e))
}

/// Sends `req` and reads the whole answer. `writes` says whether the request changes
/// state: a write that failed after it was sent may have been applied (ambiguous).
pub(crate) async fn send(req: reqwest::RequestBuilder, what: &str, writes: bool) -> Result<Reply, StoreError> {
    let failed = |e: reqwest::Error| {
        let (kind, msg) = if e.is_builder() {
            (ErrorKind::Misconfigured, format!("{what}: the request cannot be formed"))
        } else if writes && !e.is_connect() {
            let msg = "the connection failed after the request was sent; it may or may not have been applied";
            (ErrorKind::Ambiguous, format!("{what}: {msg}"))
        } else {
            (ErrorKind::Unavailable, format!("{what}: cannot reach the service"))
        };
        StoreError::new(kind, msg).with_source(e)
    };
    // A read that failed on its way (a kept connection the server closed as it was used)
    // is sent once more: reading twice changes nothing. A write is not: it may have been
    // applied, which the caller must find out.
    let again = if writes { None } else { req.try_clone() };
    let resp = match (req.send().await, again) {
        (Err(e), Some(again)) if !e.is_timeout() && !e.is_builder() => {
            tracing::debug!(error = %e, "{what}: sent again after a failure on the way");
            again.send().await.map_err(failed)?
        }
        (sent, _) => sent.map_err(failed)?,
    };
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.map_err(failed)?.to_vec();
    Ok(Reply { status, headers, body })
}

/// Milliseconds since the Unix epoch on this host's wall clock (for display only).
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A civil UTC date and time: (year, month, day, hour, minute, second, weekday 0 = Sunday).
fn civil(t: SystemTime) -> (i64, u32, u32, u32, u32, u32, u32) {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date, in the proleptic Gregorian calendar (eras of 400 years).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 4).rem_euclid(7) as u32;
    (year, month, day, (rem / 3600) as u32, (rem % 3600 / 60) as u32, (rem % 60) as u32, weekday)
}

/// `20261121T200344Z`, as AWS signatures want it.
pub(crate) fn amz_date(t: SystemTime) -> String {
    let (y, mo, d, h, mi, s, _) = civil(t);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// `Sat, 21 Nov 2026 20:03:44 GMT`, the HTTP date form.
pub(crate) fn http_date(t: SystemTime) -> String {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (y, mo, d, h, mi, s, wd) = civil(t);
    format!("{}, {d:02} {} {y:04} {h:02}:{mi:02}:{s:02} GMT", DAYS[wd as usize], MONTHS[mo as usize - 1])
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Decodes lowercase or uppercase hex.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Percent-encodes everything but the unreserved characters `A-Z a-z 0-9 - _ . ~`,
/// and `/` too when `keep_slash`.
pub(crate) fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The text of every `<tag>…</tag>` in `xml`, in order, with the five XML entities decoded.
pub(crate) fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(
            after[..j]
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&"),
        );
        rest = &after[j + close.len()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_print_as_the_services_want() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_291_424); // 2026-11-21 20:03:44 UTC
        assert_eq!(amz_date(t), "20261121T200344Z");
        assert_eq!(http_date(t), "Sat, 21 Nov 2026 20:03:44 GMT");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(amz_date(leap), "20000229T000000Z");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }

    #[test]
    fn encoding_and_xml() {
        assert_eq!(encode("a/b c+d=", true), "a/b%20c%2Bd%3D");
        assert_eq!(encode("a/b", false), "a%2Fb");
        assert_eq!(unhex(&hex(&[0, 1, 254, 255])).unwrap(), vec![0, 1, 254, 255]);
        assert_eq!(unhex("abc"), None);
        let xml = "<R><Key>a/1</Key><Key>b&amp;c</Key><Next>t</Next></R>";
        assert_eq!(xml_values(xml, "Key"), vec!["a/1", "b&c"]);
        assert!(xml_values(xml, "None").is_empty());
    }
}
