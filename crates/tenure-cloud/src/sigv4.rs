//! AWS Signature Version 4, for S3 and DynamoDB requests.

use std::time::SystemTime;

use ring::{digest, hmac};
use tenure::{ErrorKind, StoreError};

use crate::http::{amz_date, encode, hex};

/// AWS credentials: an access key, its secret and, for temporary credentials, a session token.
#[derive(Clone)]
pub struct AwsCredentials {
    /// The access key id.
    pub access_key: String,
    /// The secret access key.
    pub secret_key: String,
    /// The session token of temporary credentials.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials").field("access_key", &self.access_key).finish_non_exhaustive()
    }
}

impl AwsCredentials {
    /// Credentials given outright.
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Self {
        Self { access_key: access_key.into(), secret_key: secret_key.into(), session_token: None }
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, if set, `AWS_SESSION_TOKEN`.
    pub fn from_env() -> Result<Self, StoreError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key), Some(secret_key)) => {
                Ok(Self { access_key, secret_key, session_token: var("AWS_SESSION_TOKEN") })
            }
            _ => Err(StoreError::new(
                ErrorKind::Unauthorized,
                "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones)",
            )),
        }
    }
}

/// Hex SHA-256 of `data`.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, data).as_ref())
}

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg).as_ref().to_vec()
}

/// Signs a request: answers the headers to add (`x-amz-date`, `x-amz-content-sha256`
/// when `content_sha` is set, `x-amz-security-token`, `authorization`).
///
/// `headers` are the other headers that will be sent and signed (`host` is added here);
/// names must be lowercase.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sign(
    creds: &AwsCredentials,
    region: &str,
    service: &str,
    method: &str,
    url: &reqwest::Url,
    headers: &[(&str, String)],
    payload: &[u8],
    content_sha: bool,
    now: SystemTime,
) -> Vec<(String, String)> {
    let date_time = amz_date(now);
    let date = &date_time[..8];
    let payload_hash = sha256_hex(payload);
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut added: Vec<(String, String)> = vec![("x-amz-date".into(), date_time.clone())];
    if content_sha {
        added.push(("x-amz-content-sha256".into(), payload_hash.clone()));
    }
    if let Some(t) = &creds.session_token {
        added.push(("x-amz-security-token".into(), t.clone()));
    }
    let mut all: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .chain(added.iter().cloned())
        .chain(std::iter::once(("host".to_string(), host)))
        .collect();
    all.sort();
    let canonical_headers: String = all.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed: Vec<&str> = all.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let mut query: Vec<(String, String)> =
        url.query_pairs().map(|(k, v)| (encode(&k, false), encode(&v, false))).collect();
    query.sort();
    let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let path = if url.path().is_empty() { "/" } else { url.path() };
    let canonical = format!("{method}\n{path}\n{}\n{canonical_headers}\n{signed}\n{payload_hash}", query.join("&"));
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}", sha256_hex(canonical.as_bytes()));
    let k_date = hmac_sha256(format!("AWS4{}", creds.secret_key).as_bytes(), date.as_bytes());
    let k_region = hmac_sha256(&k_date, region.as_bytes());
    let k_service = hmac_sha256(&k_region, service.as_bytes());
    let k_signing = hmac_sha256(&k_service, b"aws4_request");
    let signature = hex(&hmac_sha256(&k_signing, to_sign.as_bytes()));
    added.push((
        "authorization".into(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            creds.access_key
        ),
    ));
    added
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    /// The signature AWS documents for its IAM `ListUsers` example request.
    #[test]
    fn matches_the_documented_example() {
        let creds = AwsCredentials::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
        let url = reqwest::Url::parse("https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08").unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160); // 2015-08-30 12:36:00 UTC
        let headers = [("content-type", "application/x-www-form-urlencoded; charset=utf-8".to_string())];
        let added = sign(&creds, "us-east-1", "iam", "GET", &url, &headers, b"", false, now);
        let auth = &added.iter().find(|(k, _)| k == "authorization").unwrap().1;
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    /// S3 requests: a conditional PUT with a session token, and a listing whose query
    /// needs encoding (reference values from another SigV4 implementation).
    #[test]
    fn signs_s3_requests() {
        let now = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let mut creds = AwsCredentials::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
        let auth = |added: Vec<(String, String)>| added.into_iter().find(|(k, _)| k == "authorization").unwrap().1;
        let list = reqwest::Url::parse(
            "http://127.0.0.1:5101/bucket-two?list-type=2&prefix=tenure%2Fjobs%2F&continuation-token=a%2Bb%3D",
        )
        .unwrap();
        assert!(auth(sign(&creds, "us-east-1", "s3", "GET", &list, &[], b"", true, now)).ends_with(
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, \
             Signature=bd6ea32d16a28e0656949c4578635295f105536df1f579a214bed7ee32676ce6"
        ));
        creds.session_token = Some("SESSIONTOKEN".into());
        let put = reqwest::Url::parse("http://127.0.0.1:5101/bucket-two/tenure/jobs/a-b_c.d?x-id=PutObject").unwrap();
        let headers = [("content-type", "application/json".to_string()), ("if-match", "\"abc\"".to_string())];
        let added = sign(&creds, "eu-west-1", "s3", "PUT", &put, &headers, br#"{"v":1}"#, true, now);
        assert!(added.contains(&(
            "x-amz-content-sha256".into(),
            "afbf9d0f3560b0fd7795e81c42a0a79ee6b6fc67e064f77826aee642cad28d91".into()
        )));
        assert!(auth(added).ends_with(
            "SignedHeaders=content-type;host;if-match;x-amz-content-sha256;x-amz-date;x-amz-security-token, \
             Signature=d1dad989301f2787bac80dd414f2bc7615d03160f77aaba2c9b9e16215d96a4d"
        ));
    }
}
