//! # tenure-cloud: lease stores on cloud storage
//!
//! - [`AzureStore`] (`azblob://ACCOUNT/CONTAINER[/PREFIX]`): the blob's native lease,
//!   one blob per election; the service's clock judges expiry.
//! - [`S3Store`] (`s3://BUCKET[/PREFIX]`), [`GcsStore`] (`gs://BUCKET[/PREFIX]`) and
//!   [`DynamoStore`] (`dynamodb://TABLE`): one object or item per election, written only
//!   conditionally on the version read. These services have no clock a lease can rely
//!   on, so expiry is judged by the observer ([`tenure::store::ObservedExpiry`]): a candidate
//!   takes over only after seeing the same version unchanged for the TTL plus a margin.
//!
//! None of them can notify: followers poll.

mod azure;
mod dynamodb;
mod gcs;
mod http;
mod object;
mod s3;
mod sigv4;

pub use azure::{AzureConfig, AzureStore, MAX_LEASE, MIN_LEASE};
pub use dynamodb::{DynamoConfig, DynamoObjects, DynamoStore};
pub use gcs::{GcsAuth, GcsConfig, GcsObjects, GcsStore};
pub use object::{Objects, ObservedStore, Stored};
pub use s3::{S3Config, S3Objects, S3Store};
pub use sigv4::AwsCredentials;

use tenure::StoreError;
use tenure::store::url::take_params;

/// An environment variable, if set and not empty.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Checks a key prefix: the characters of election names (`A-Z a-z 0-9 . _ - /`), at
/// most 200 of them.
fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    let ok = prefix.len() <= 200
        && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        && !prefix.split('/').any(|s| s == "." || s == "..");
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "prefix {prefix:?} is not allowed: use at most 200 of A-Z a-z 0-9 . _ - /, with no . or .. segment"
        )))
    }
}

/// Takes `url` apart: the text after `scheme` (e.g. `s3://`) and the values of the query
/// parameters named in `params`. Another scheme, or a parameter not in `params`, is an
/// error that shows the URL's `form` (e.g. `an S3 URL` / `s3://BUCKET[/PREFIX]`).
fn split_url(
    url: &str,
    scheme: &str,
    params: &[&str],
    kind: &str,
    form: &str,
) -> Result<(String, Vec<Option<String>>), StoreError> {
    let (rest, values) =
        take_params(url, params).map_err(|why| StoreError::invalid(format!("{kind} ({form}): {why}")))?;
    let Some(rest) = rest.strip_prefix(scheme) else {
        return Err(StoreError::invalid(format!("{url:?} is not {kind}; write {form}")));
    };
    if rest.contains('?') {
        let known: Vec<String> = params.iter().map(|p| format!("{p}=")).collect();
        return Err(StoreError::invalid(format!(
            "{url:?} has parameters tenure does not know; it reads {}",
            known.join(" and ")
        )));
    }
    Ok((rest.to_string(), values))
}

/// Checks a bucket name: 3 to 63 lowercase letters, digits, dots, hyphens and the bytes
/// in `also`, starting and ending with a letter or digit. `rule` words the set for the error.
fn check_bucket(bucket: &str, also: &[u8], rule: &str) -> Result<(), StoreError> {
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b) || also.contains(&b))
        && bucket.starts_with(|c: char| c.is_ascii_alphanumeric())
        && bucket.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "bucket name {bucket:?} is not valid: 3 to 63 {rule}, starting and ending with a letter or digit"
        )))
    }
}

/// `BUCKET[/PREFIX]` → the bucket, checked by [`check_bucket`]`(also, rule)`, and the
/// checked prefix (default `tenure`).
fn bucket_and_prefix<'a>(rest: &'a str, also: &[u8], rule: &str) -> Result<(&'a str, &'a str), StoreError> {
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = if prefix.trim_matches('/').is_empty() { "tenure" } else { prefix };
    check_bucket(bucket, also, rule)?;
    check_prefix(prefix)?;
    Ok((bucket, prefix))
}

/// The AWS region: the URL's `region=`, else `AWS_REGION`, else `AWS_DEFAULT_REGION`,
/// else `us-east-1`.
fn aws_region(param: Option<String>) -> String {
    param
        .or_else(|| env_var("AWS_REGION"))
        .or_else(|| env_var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|| "us-east-1".into())
}

/// An endpoint override: the URL's `endpoint=`, else the service's variable (e.g.
/// `AWS_ENDPOINT_URL_S3`), else `AWS_ENDPOINT_URL`.
fn aws_endpoint(param: Option<String>, service_var: &str) -> Option<String> {
    param.or_else(|| env_var(service_var)).or_else(|| env_var("AWS_ENDPOINT_URL"))
}

use tenure::mutant;
