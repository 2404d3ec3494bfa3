//! S3 and S3-compatible services: one object per election, created with
//! `If-None-Match: *` and replaced with `If-Match: <etag>`.

use std::time::SystemTime;

use tenure::store::ObservedExpiry;
use tenure::{ErrorKind, StoreError};

use crate::http::{self, Reply, encode, xml_values};
use crate::object::{Objects, ObservedStore, Stored, read_each};
use crate::sigv4::{AwsCredentials, sign};
use crate::{aws_endpoint, aws_region, bucket_and_prefix, split_url};

/// The S3 lease store: [`ObservedStore`] over [`S3Objects`].
pub type S3Store = ObservedStore<S3Objects>;

/// Where and how to reach a bucket.
#[derive(Clone, Debug)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// Keys start with this (default `tenure`).
    pub prefix: String,
    /// The region (default `us-east-1`).
    pub region: String,
    /// An S3-compatible endpoint, e.g. `http://127.0.0.1:9000`: then requests use path-style
    /// addresses. `None` is AWS itself, addressed virtual-host style.
    pub endpoint: Option<String>,
    /// The credentials.
    pub credentials: AwsCredentials,
}

impl S3Config {
    /// Reads `s3://BUCKET[/PREFIX][?region=R&endpoint=URL]`, with the region from
    /// `AWS_REGION` or `AWS_DEFAULT_REGION`, the endpoint from `AWS_ENDPOINT_URL_S3` or
    /// `AWS_ENDPOINT_URL`, and the credentials from the environment ([`AwsCredentials::from_env`]).
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (rest, params) = split_url(url, "s3://", &["region", "endpoint"], "an S3 URL", "s3://BUCKET[/PREFIX]")?;
        let (bucket, prefix) = bucket_and_prefix(&rest, b"", "lowercase letters, digits, dots and hyphens")?;
        let region = aws_region(params[0].clone());
        let endpoint = aws_endpoint(params[1].clone(), "AWS_ENDPOINT_URL_S3");
        Ok(Self {
            bucket: bucket.into(),
            prefix: prefix.into(),
            region,
            endpoint,
            credentials: AwsCredentials::from_env()?,
        })
    }
}

/// The objects of one S3 bucket.
pub struct S3Objects {
    http: reqwest::Client,
    config: S3Config,
}

impl S3Store {
    /// Opens the store a `s3://` URL names ([`S3Config::from_url`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(S3Config::from_url(url)?).await
    }

    /// Opens the store: checks that the bucket can be reached with these credentials,
    /// and creates it if it does not exist.
    pub async fn connect_with(config: S3Config) -> Result<Self, StoreError> {
        let prefix = config.prefix.clone();
        let objects = S3Objects { http: http::client()?, config };
        objects.ensure_bucket().await?;
        Ok(ObservedStore::new(objects, &prefix, ObservedExpiry::new()))
    }
}

impl S3Objects {
    fn url(&self, key: Option<&str>, query: &str) -> Result<reqwest::Url, StoreError> {
        let c = &self.config;
        let key = key.map(|k| encode(k, true)).unwrap_or_default();
        let base = match &c.endpoint {
            Some(ep) => format!("{}/{}/{key}", ep.trim_end_matches('/'), c.bucket),
            None => format!("https://{}.s3.{}.amazonaws.com/{key}", c.bucket, c.region),
        };
        let full = if query.is_empty() { base } else { format!("{base}?{query}") };
        reqwest::Url::parse(&full)
            .map_err(|e| StoreError::invalid(format!("cannot form an S3 address from {full:?}")).with_source(e))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        url: reqwest::Url,
        headers: &[(&str, String)],
        body: &[u8],
        what: &str,
    ) -> Result<Reply, StoreError> {
        let writes = method == reqwest::Method::PUT;
        let c = &self.config;
        let added =
            sign(&c.credentials, &c.region, "s3", method.as_str(), &url, headers, body, true, SystemTime::now());
        let mut req = self.http.request(method, url).body(body.to_vec());
        for (k, v) in headers.iter().map(|(k, v)| (k.to_string(), v.clone())).chain(added) {
            req = req.header(k, v);
        }
        http::send(req, what, writes).await
    }

    async fn ensure_bucket(&self) -> Result<(), StoreError> {
        let what = format!("checking the bucket {}", self.config.bucket);
        let r = self.call(reqwest::Method::HEAD, self.url(None, "")?, &[], b"", &what).await?;
        match r.status {
            200 => Ok(()),
            404 => {
                let body = match self.config.region.as_str() {
                    "us-east-1" => String::new(),
                    region => format!(
                        "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
                         <LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
                    ),
                };
                let what = format!("creating the bucket {}", self.config.bucket);
                let r = self.call(reqwest::Method::PUT, self.url(None, "")?, &[], body.as_bytes(), &what).await?;
                match r.status {
                    200 | 409 => Ok(()),
                    _ => Err(r.error(&what, true)),
                }
            }
            _ => Err(r.error(&what, false)),
        }
    }

    fn etag(r: &Reply, what: &str) -> Result<String, StoreError> {
        r.header("etag")
            .map(str::to_string)
            .ok_or_else(|| StoreError::new(ErrorKind::Misconfigured, format!("{what}: the answer carries no ETag")))
    }
}

#[async_trait::async_trait]
impl Objects for S3Objects {
    async fn read(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let what = format!("reading s3://{}/{key}", self.config.bucket);
        let r = self.call(reqwest::Method::GET, self.url(Some(key), "")?, &[], b"", &what).await?;
        match r.status {
            200 => Ok(Some(Stored { version: Self::etag(&r, &what)?, body: r.body })),
            404 if xml_values(&String::from_utf8_lossy(&r.body), "Code").iter().any(|c| c == "NoSuchBucket") => {
                Err(StoreError::new(ErrorKind::Misconfigured, format!("{what}: the bucket does not exist")))
            }
            404 => Ok(None),
            _ => Err(r.error(&what, false)),
        }
    }

    async fn write(&self, key: &str, at: Option<&str>, _rev: u64, body: &[u8]) -> Result<Option<String>, StoreError> {
        let what = format!("writing s3://{}/{key}", self.config.bucket);
        let condition = match at {
            Some(etag) => ("if-match", etag.to_string()),
            None => ("if-none-match", "*".to_string()),
        };
        let headers = [("content-type", "application/json".to_string()), condition];
        let r = self.call(reqwest::Method::PUT, self.url(Some(key), "")?, &headers, body, &what).await?;
        match r.status {
            200 => Ok(Some(Self::etag(&r, &what)?)),
            // 412: the condition failed; 409: a concurrent conditional write won; 404: the
            // object expected is gone.
            412 | 409 | 404 => Ok(None),
            _ => Err(r.error(&what, true)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>, StoreError> {
        let what = format!("listing s3://{}/{prefix}", self.config.bucket);
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = format!("list-type=2&prefix={}", encode(prefix, false));
            if let Some(t) = &token {
                query.push_str(&format!("&continuation-token={}", encode(t, false)));
            }
            let r = self.call(reqwest::Method::GET, self.url(None, &query)?, &[], b"", &what).await?;
            if r.status != 200 {
                return Err(r.error(&what, false));
            }
            let xml = String::from_utf8_lossy(&r.body);
            keys.extend(xml_values(&xml, "Key"));
            token = xml_values(&xml, "NextContinuationToken").into_iter().next();
            if token.is_none() || xml_values(&xml, "IsTruncated").first().map(String::as_str) != Some("true") {
                break;
            }
        }
        read_each(self, keys).await
    }

    fn describe(&self) -> String {
        let c = &self.config;
        match &c.endpoint {
            Some(ep) => format!("s3://{}/{} at {ep}", c.bucket, c.prefix),
            None => format!("s3://{}/{} in {}", c.bucket, c.prefix, c.region),
        }
    }
}
