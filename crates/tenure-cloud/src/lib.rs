//! # tenure-cloud: lease stores on cloud storage
//!
//! - [`AzureStore`] (`azblob://ACCOUNT/CONTAINER[/PREFIX]`): the blob's native lease,
//!   one blob per election; the service's clock judges expiry.
//! - [`S3Store`] (`s3://BUCKET[/PREFIX]`), [`GcsStore`] (`gs://BUCKET[/PREFIX]`) and
//!   [`DynamoStore`] (`dynamodb://TABLE`): one object or item per election, written only
//!   conditionally on the version read. These services have no clock a lease can rely
//!   on, so expiry is judged by the observer ([`tenure::ObservedExpiry`]): a candidate
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
