//! DynamoDB: one item per election, written with a condition on its version number
//! (`attribute_not_exists` for the first write). The table is created on first use.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tenure::store::ObservedExpiry;
use tenure::{ErrorKind, StoreError};

use crate::http::{self, Reply};
use crate::object::{Objects, ObservedStore, Stored};
use crate::sigv4::{AwsCredentials, sign};
use crate::{aws_endpoint, aws_region, split_url};

/// The DynamoDB lease store: [`ObservedStore`] over [`DynamoObjects`].
pub type DynamoStore = ObservedStore<DynamoObjects>;

/// Where and how to reach a table.
#[derive(Clone, Debug)]
pub struct DynamoConfig {
    /// The table (created on first use, keyed by the string attribute `election`).
    pub table: String,
    /// The region (default `us-east-1`).
    pub region: String,
    /// A DynamoDB-compatible endpoint, e.g. `http://127.0.0.1:8000`; `None` is AWS itself.
    pub endpoint: Option<String>,
    /// The credentials.
    pub credentials: AwsCredentials,
}

impl DynamoConfig {
    /// Reads `dynamodb://TABLE[?region=R&endpoint=URL]`, with the region from `AWS_REGION`
    /// or `AWS_DEFAULT_REGION`, the endpoint from `AWS_ENDPOINT_URL_DYNAMODB` or
    /// `AWS_ENDPOINT_URL`, and the credentials from the environment.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (table, params) =
            split_url(url, "dynamodb://", &["region", "endpoint"], "a DynamoDB URL", "dynamodb://TABLE")?;
        let table = table.trim_end_matches('/');
        let ok = (3..=255).contains(&table.len())
            && table.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !ok {
            return Err(StoreError::invalid(format!(
                "table name {table:?} is not valid: 3 to 255 letters, digits, underscores, hyphens and dots"
            )));
        }
        let region = aws_region(params[0].clone());
        let endpoint = aws_endpoint(params[1].clone(), "AWS_ENDPOINT_URL_DYNAMODB");
        Ok(Self { table: table.into(), region, endpoint, credentials: AwsCredentials::from_env()? })
    }
}

/// The items of one DynamoDB table.
pub struct DynamoObjects {
    http: reqwest::Client,
    config: DynamoConfig,
    url: reqwest::Url,
}

impl DynamoStore {
    /// Opens the store a `dynamodb://` URL names ([`DynamoConfig::from_url`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(DynamoConfig::from_url(url)?).await
    }

    /// Opens the store: creates the table if it does not exist and waits until it is active.
    pub async fn connect_with(config: DynamoConfig) -> Result<Self, StoreError> {
        let endpoint = match &config.endpoint {
            Some(ep) => ep.trim_end_matches('/').to_string(),
            None => format!("https://dynamodb.{}.amazonaws.com", config.region),
        };
        let url = reqwest::Url::parse(&format!("{endpoint}/"))
            .map_err(|e| StoreError::invalid(format!("{endpoint:?} is not a usable endpoint")).with_source(e))?;
        let objects = DynamoObjects { http: http::client()?, config, url };
        objects.ensure_table().await?;
        Ok(ObservedStore::new(objects, "", ObservedExpiry::new()))
    }
}

/// A DynamoDB answer: success with its JSON, or the error type DynamoDB named.
enum Answer {
    Ok(Value),
    Failed { kind: String, reply: Reply },
}

impl DynamoObjects {
    async fn call(&self, action: &str, body: Value, writes: bool) -> Result<Answer, StoreError> {
        let c = &self.config;
        let payload = body.to_string().into_bytes();
        let headers = [
            ("content-type", "application/x-amz-json-1.0".to_string()),
            ("x-amz-target", format!("DynamoDB_20120810.{action}")),
        ];
        let added = sign(
            &c.credentials,
            &c.region,
            "dynamodb",
            "POST",
            &self.url,
            &headers,
            &payload,
            false,
            SystemTime::now(),
        );
        let mut req = self.http.post(self.url.clone()).body(payload);
        for (k, v) in headers.iter().map(|(k, v)| (k.to_string(), v.clone())).chain(added) {
            req = req.header(k, v);
        }
        let what = format!("DynamoDB {action} on table {}", c.table);
        let reply = http::send(req, &what, writes).await?;
        let json: Value = serde_json::from_slice(&reply.body).unwrap_or(Value::Null);
        if reply.status == 200 {
            return Ok(Answer::Ok(json));
        }
        // "com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException" → the last part.
        let kind = json["__type"].as_str().unwrap_or_default().rsplit('#').next().unwrap_or_default().to_string();
        Ok(Answer::Failed { kind, reply })
    }

    fn fail(&self, action: &str, kind: &str, reply: &Reply, writes: bool) -> StoreError {
        let what = format!("DynamoDB {action} on table {}", self.config.table);
        match kind {
            "ProvisionedThroughputExceededException" | "ThrottlingException" | "RequestLimitExceeded" => {
                StoreError::unavailable(format!("{what} was throttled ({kind}); try again"))
            }
            "UnrecognizedClientException" | "InvalidSignatureException" | "AccessDeniedException" => {
                StoreError::new(ErrorKind::Unauthorized, format!("{what} was refused ({kind}): {}", reply.excerpt()))
            }
            _ => reply.error(&what, writes),
        }
    }

    async fn ensure_table(&self) -> Result<(), StoreError> {
        let table = &self.config.table;
        let describe = json!({ "TableName": table });
        let mut created = false;
        for _ in 0..120 {
            match self.call("DescribeTable", describe.clone(), false).await? {
                Answer::Ok(v) if v["Table"]["TableStatus"] == "ACTIVE" => return Ok(()),
                Answer::Ok(_) => {}
                Answer::Failed { kind, .. } if kind == "ResourceNotFoundException" && !created => {
                    let spec = json!({
                        "TableName": table,
                        "AttributeDefinitions": [{ "AttributeName": "election", "AttributeType": "S" }],
                        "KeySchema": [{ "AttributeName": "election", "KeyType": "HASH" }],
                        "BillingMode": "PAY_PER_REQUEST",
                    });
                    match self.call("CreateTable", spec, true).await? {
                        Answer::Ok(_) => {}
                        Answer::Failed { kind, .. } if kind == "ResourceInUseException" => {}
                        Answer::Failed { kind, reply } => return Err(self.fail("CreateTable", &kind, &reply, true)),
                    }
                    created = true;
                    continue;
                }
                Answer::Failed { kind, .. } if kind == "ResourceNotFoundException" => {}
                Answer::Failed { kind, reply } => return Err(self.fail("DescribeTable", &kind, &reply, false)),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(StoreError::unavailable(format!("the table {table} did not become active within a minute")))
    }

    fn stored(item: &Value) -> Option<(String, Stored)> {
        let key = item["election"]["S"].as_str()?.to_string();
        let version = item["ver"]["N"].as_str()?.to_string();
        let body = item["body"]["S"].as_str()?.as_bytes().to_vec();
        Some((key, Stored { version, body }))
    }
}

#[async_trait::async_trait]
impl Objects for DynamoObjects {
    async fn read(&self, key: &str) -> Result<Option<Stored>, StoreError> {
        let req = json!({
            "TableName": self.config.table,
            "Key": { "election": { "S": key } },
            "ConsistentRead": true,
        });
        match self.call("GetItem", req, false).await? {
            Answer::Ok(v) if v["Item"].is_object() => match Self::stored(&v["Item"]) {
                Some((_, s)) => Ok(Some(s)),
                None => Err(StoreError::new(
                    ErrorKind::Misconfigured,
                    format!("the item {key:?} in table {} is not a tenure lease record", self.config.table),
                )),
            },
            Answer::Ok(_) => Ok(None),
            Answer::Failed { kind, reply } => Err(self.fail("GetItem", &kind, &reply, false)),
        }
    }

    async fn write(&self, key: &str, at: Option<&str>, rev: u64, body: &[u8]) -> Result<Option<String>, StoreError> {
        let body = String::from_utf8_lossy(body);
        let mut req = json!({
            "TableName": self.config.table,
            "Item": {
                "election": { "S": key },
                "ver": { "N": rev.to_string() },
                "body": { "S": body },
            },
        });
        match at {
            None => req["ConditionExpression"] = json!("attribute_not_exists(election)"),
            Some(v) => {
                req["ConditionExpression"] = json!("#v = :v");
                req["ExpressionAttributeNames"] = json!({ "#v": "ver" });
                req["ExpressionAttributeValues"] = json!({ ":v": { "N": v } });
            }
        }
        match self.call("PutItem", req, true).await? {
            Answer::Ok(_) => Ok(Some(rev.to_string())),
            Answer::Failed { kind, .. } if kind == "ConditionalCheckFailedException" => Ok(None),
            // Another transaction touched the item at the same moment: nothing was written.
            Answer::Failed { kind, .. } if kind == "TransactionConflictException" => Ok(None),
            Answer::Failed { kind, reply } => Err(self.fail("PutItem", &kind, &reply, true)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Stored)>, StoreError> {
        let mut out = Vec::new();
        let mut start: Option<Value> = None;
        loop {
            let mut req = json!({ "TableName": self.config.table, "ConsistentRead": true });
            if !prefix.is_empty() {
                req["FilterExpression"] = json!("begins_with(election, :p)");
                req["ExpressionAttributeValues"] = json!({ ":p": { "S": prefix } });
            }
            if let Some(s) = start.take() {
                req["ExclusiveStartKey"] = s;
            }
            match self.call("Scan", req, false).await? {
                Answer::Ok(v) => {
                    if let Some(items) = v["Items"].as_array() {
                        out.extend(items.iter().filter_map(Self::stored));
                    }
                    match &v["LastEvaluatedKey"] {
                        Value::Object(_) => start = Some(v["LastEvaluatedKey"].clone()),
                        _ => return Ok(out),
                    }
                }
                Answer::Failed { kind, reply } => return Err(self.fail("Scan", &kind, &reply, false)),
            }
        }
    }

    fn describe(&self) -> String {
        let c = &self.config;
        match &c.endpoint {
            Some(ep) => format!("dynamodb://{} at {ep}", c.table),
            None => format!("dynamodb://{} in {}", c.table, c.region),
        }
    }
}
