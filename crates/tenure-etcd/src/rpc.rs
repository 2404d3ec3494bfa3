//! etcd's v3 gRPC API: the messages and calls this store uses, declared by hand with
//! prost's derive macros. Building needs no `protoc` and no build script; a message
//! decodes the fields it declares and skips the rest, as protobuf allows, so fields
//! newer servers add change nothing.
//!
//! Field numbers follow etcd's `rpc.proto` (package `etcdserverpb`) and `kv.proto`
//! (package `mvccpb`), which etcd keeps stable across versions; the tests run every
//! call against a real server.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

/// The messages, with etcd's field numbers.
#[rustfmt::skip]
pub mod pb {
    #![allow(missing_docs)]

    /// Sent with every response: the store revision it was served at.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(uint64, tag = "1")] pub cluster_id: u64,
        #[prost(uint64, tag = "2")] pub member_id: u64,
        #[prost(int64, tag = "3")] pub revision: i64,
        #[prost(uint64, tag = "4")] pub raft_term: u64,
    }

    /// A key as stored (`mvccpb.KeyValue`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")] pub key: Vec<u8>,
        #[prost(int64, tag = "2")] pub create_revision: i64,
        #[prost(int64, tag = "3")] pub mod_revision: i64,
        #[prost(int64, tag = "4")] pub version: i64,
        #[prost(bytes = "vec", tag = "5")] pub value: Vec<u8>,
        #[prost(int64, tag = "6")] pub lease: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")] pub key: Vec<u8>,
        /// Every key in `[key, range_end)`; see [`super::prefix_end`].
        #[prost(bytes = "vec", tag = "2")] pub range_end: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")] pub kvs: Vec<KeyValue>,
        #[prost(bool, tag = "3")] pub more: bool,
        #[prost(int64, tag = "4")] pub count: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")] pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")] pub value: Vec<u8>,
        #[prost(int64, tag = "3")] pub lease: i64,
        #[prost(bool, tag = "4")] pub prev_kv: bool,
        /// Keep the stored value (only the revision, and the lease if given, change).
        #[prost(bool, tag = "5")] pub ignore_value: bool,
        #[prost(bool, tag = "6")] pub ignore_lease: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeRequest {
        #[prost(bytes = "vec", tag = "1")] pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")] pub range_end: Vec<u8>,
        #[prost(bool, tag = "3")] pub prev_kv: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DeleteRangeResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")] pub deleted: i64,
        #[prost(message, repeated, tag = "3")] pub prev_kvs: Vec<KeyValue>,
    }

    /// One condition of a transaction.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        #[prost(enumeration = "CompareResult", tag = "1")] pub result: i32,
        #[prost(enumeration = "CompareTarget", tag = "2")] pub target: i32,
        #[prost(bytes = "vec", tag = "3")] pub key: Vec<u8>,
        #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7, 8")] pub target_union: Option<TargetUnion>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum CompareResult { Equal = 0, Greater = 1, Less = 2, NotEqual = 3 }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum CompareTarget { Version = 0, Create = 1, Mod = 2, Value = 3, Lease = 4 }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum TargetUnion {
        #[prost(int64, tag = "4")] Version(i64),
        #[prost(int64, tag = "5")] CreateRevision(i64),
        #[prost(int64, tag = "6")] ModRevision(i64),
        #[prost(bytes, tag = "7")] Value(Vec<u8>),
        #[prost(int64, tag = "8")] Lease(i64),
    }

    /// One operation of a transaction.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(oneof = "Request", tags = "1, 2, 3, 4")] pub request: Option<Request>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "1")] Range(RangeRequest),
        #[prost(message, tag = "2")] Put(PutRequest),
        #[prost(message, tag = "3")] DeleteRange(DeleteRangeRequest),
        #[prost(message, tag = "4")] Txn(TxnRequest),
    }

    /// The answer to one operation of a transaction.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseOp {
        #[prost(oneof = "Response", tags = "1, 2, 3, 4")] pub response: Option<Response>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")] Range(RangeResponse),
        #[prost(message, tag = "2")] Put(PutResponse),
        #[prost(message, tag = "3")] DeleteRange(DeleteRangeResponse),
        #[prost(message, tag = "4")] Txn(TxnResponse),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")] pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")] pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")] pub failure: Vec<RequestOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")] pub succeeded: bool,
        #[prost(message, repeated, tag = "3")] pub responses: Vec<ResponseOp>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantRequest {
        #[prost(int64, tag = "1")] pub ttl: i64,
        #[prost(int64, tag = "2")] pub id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseGrantResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")] pub id: i64,
        #[prost(int64, tag = "3")] pub ttl: i64,
        #[prost(string, tag = "4")] pub error: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseKeepAliveRequest {
        #[prost(int64, tag = "1")] pub id: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct LeaseKeepAliveResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")] pub id: i64,
        /// The TTL the lease was refreshed to; 0 or less when the lease no longer exists.
        #[prost(int64, tag = "3")] pub ttl: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchRequest {
        #[prost(oneof = "WatchRequestUnion", tags = "1")] pub request_union: Option<WatchRequestUnion>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum WatchRequestUnion {
        #[prost(message, tag = "1")] CreateRequest(WatchCreateRequest),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchCreateRequest {
        #[prost(bytes = "vec", tag = "1")] pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")] pub range_end: Vec<u8>,
        #[prost(int64, tag = "3")] pub start_revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(int64, tag = "2")] pub watch_id: i64,
        #[prost(bool, tag = "3")] pub created: bool,
        #[prost(bool, tag = "4")] pub canceled: bool,
        #[prost(int64, tag = "5")] pub compact_revision: i64,
        #[prost(string, tag = "6")] pub cancel_reason: String,
        #[prost(message, repeated, tag = "11")] pub events: Vec<Event>,
    }

    /// A change of one key (`mvccpb.Event`).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Event {
        #[prost(enumeration = "EventType", tag = "1")] pub r#type: i32,
        #[prost(message, optional, tag = "2")] pub kv: Option<KeyValue>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum EventType {
        Put = 0,
        Delete = 1,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AuthenticateRequest {
        #[prost(string, tag = "1")] pub name: String,
        #[prost(string, tag = "2")] pub password: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AuthenticateResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        #[prost(string, tag = "2")] pub token: String,
    }

    #[cfg(test)]
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {}

    #[cfg(test)]
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        #[prost(message, optional, tag = "1")] pub header: Option<ResponseHeader>,
        /// The member's etcd version, e.g. `3.4.23`.
        #[prost(string, tag = "2")] pub version: String,
        /// The member ID of the leader this member knows of (0: none).
        #[prost(uint64, tag = "4")] pub leader: u64,
    }
}

/// The end of the key range that holds every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// A failure of a call: the server's status, or a connection that could not be set up.
#[derive(Debug)]
pub enum Error {
    /// The server (or the transport on the way) answered with a gRPC status.
    Status(Status),
    /// The connection settings are unusable (an endpoint or TLS setting).
    Config(String),
}

impl From<Status> for Error {
    fn from(s: Status) -> Self {
        Error::Status(s)
    }
}

impl std::fmt::Display for Error {
    /// A status as its message alone (the status's own text repeats its whole source
    /// chain, in debug form); the cause follows as the source.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Status(s) if s.message().is_empty() => write!(f, "{:?}", s.code()),
            Error::Status(s) => f.write_str(s.message()),
            Error::Config(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Status(s) => std::error::Error::source(s),
            Error::Config(_) => None,
        }
    }
}

/// How to reach the cluster.
pub struct Options {
    /// `http://HOST:PORT` or `https://HOST:PORT`, one per member.
    pub endpoints: Vec<String>,
    /// User and password, for clusters with authentication on.
    pub user: Option<(String, String)>,
    /// PEM of a private CA; with `https` endpoints, the system's roots otherwise.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of a client certificate and its key, for members that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// How long making a connection may take.
    pub connect_timeout: Duration,
    /// HTTP/2 keep-alive pings: the interval and how long to wait for the answer.
    pub keep_alive: (Duration, Duration),
}

/// A client for the calls this store makes. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    user: Option<Arc<(String, String)>>,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
}

const RANGE: &str = "/etcdserverpb.KV/Range";
const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
const TXN: &str = "/etcdserverpb.KV/Txn";
const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
const LEASE_KEEP_ALIVE: &str = "/etcdserverpb.Lease/LeaseKeepAlive";
const WATCH: &str = "/etcdserverpb.Watch/Watch";
const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
#[cfg(test)]
const STATUS: &str = "/etcdserverpb.Maintenance/Status";

/// A bidirectional stream: requests go into the sender, answers come out of `Streaming`.
pub type Duplex<Req, Resp> = (tokio::sync::mpsc::Sender<Req>, Streaming<Resp>);

impl Client {
    /// Sets up a connection to the members in `opts` (made on first use, and remade
    /// after failures) and, with a user, authenticates.
    pub async fn connect(opts: &Options) -> Result<Self, Error> {
        let mut endpoints = Vec::with_capacity(opts.endpoints.len());
        for e in &opts.endpoints {
            let mut ep = Endpoint::from_shared(e.clone())
                .map_err(|err| Error::Config(format!("endpoint {e}: {err}")))?
                .connect_timeout(opts.connect_timeout)
                .http2_keep_alive_interval(opts.keep_alive.0)
                .keep_alive_timeout(opts.keep_alive.1)
                .keep_alive_while_idle(true);
            if e.starts_with("https://") {
                // A private CA replaces the system's roots: a member must chain to it.
                let mut tls = match &opts.ca_pem {
                    Some(pem) => tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(pem)),
                    None => tonic::transport::ClientTlsConfig::new().with_native_roots(),
                };
                if let Some((cert, key)) = &opts.identity {
                    tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
                }
                ep = ep.tls_config(tls).map_err(|err| Error::Config(format!("TLS for {e}: {err}")))?;
            }
            endpoints.push(ep);
        }
        let channel = match endpoints.len() {
            1 => endpoints.pop().expect("one endpoint").connect_lazy(),
            _ => Channel::balance_list(endpoints.into_iter()),
        };
        let client = Self { channel, user: opts.user.clone().map(Arc::new), token: Arc::default() };
        if client.user.is_some() {
            client.authenticate().await?;
        }
        Ok(client)
    }

    /// Gets a fresh token for the user.
    async fn authenticate(&self) -> Result<(), Error> {
        let Some(user) = &self.user else { return Ok(()) };
        let req = pb::AuthenticateRequest { name: user.0.clone(), password: user.1.clone() };
        let resp: pb::AuthenticateResponse = self.call(AUTHENTICATE, Request::new(req)).await?;
        let token = AsciiMetadataValue::try_from(resp.token.as_str())
            .map_err(|_| Error::Config("etcd sent an auth token that is not ASCII".into()))?;
        *self.token.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
        Ok(())
    }

    /// Adds what every request carries: the token, and "answer only with a leader".
    fn stamp(&self, md: &mut MetadataMap) {
        if let Some(t) = self.token.read().unwrap_or_else(|p| p.into_inner()).clone() {
            md.insert("token", t);
        }
        md.insert("hasleader", AsciiMetadataValue::from_static("true"));
    }

    async fn call<Req, Resp>(&self, path: &'static str, mut req: Request<Req>) -> Result<Resp, Error>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.stamp(req.metadata_mut());
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| Status::unavailable(format!("the connection is not ready: {e}")))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        Ok(grpc.unary(req, PathAndQuery::from_static(path), codec).await?.into_inner())
    }

    /// A unary call; with a user, a token that ran out is renewed and the call made once more.
    async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, Error>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        match self.call(path, Request::new(req.clone())).await {
            Err(Error::Status(s)) if self.user.is_some() && token_expired(&s) => {
                self.authenticate().await?;
                self.call(path, Request::new(req)).await
            }
            other => other,
        }
    }

    async fn duplex<Req, Resp>(&self, path: &'static str, first: Req) -> Result<Duplex<Req, Resp>, Error>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut renewed = false;
        loop {
            let (tx, rx) = tokio::sync::mpsc::channel(16);
            tx.try_send(first.clone()).expect("a new channel has room");
            let mut req = Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
            self.stamp(req.metadata_mut());
            let mut grpc = tonic::client::Grpc::new(self.channel.clone());
            grpc.ready().await.map_err(|e| Status::unavailable(format!("the connection is not ready: {e}")))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            match grpc.streaming(req, PathAndQuery::from_static(path), codec).await {
                Ok(resp) => return Ok((tx, resp.into_inner())),
                Err(s) if !renewed && self.user.is_some() && token_expired(&s) => {
                    renewed = true;
                    self.authenticate().await?;
                }
                Err(s) => return Err(s.into()),
            }
        }
    }

    /// Reads a key, or every key in `[key, range_end)`.
    pub async fn range(&self, key: Vec<u8>, range_end: Vec<u8>) -> Result<pb::RangeResponse, Error> {
        self.unary(RANGE, pb::RangeRequest { key, range_end }).await
    }

    /// Deletes a key and returns what it held.
    pub async fn delete(&self, key: Vec<u8>) -> Result<pb::DeleteRangeResponse, Error> {
        self.unary(DELETE_RANGE, pb::DeleteRangeRequest { key, range_end: Vec::new(), prev_kv: true }).await
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: pb::TxnRequest) -> Result<pb::TxnResponse, Error> {
        self.unary(TXN, txn).await
    }

    /// Grants a lease of `ttl` seconds.
    pub async fn lease_grant(&self, ttl: i64) -> Result<pb::LeaseGrantResponse, Error> {
        self.unary(LEASE_GRANT, pb::LeaseGrantRequest { ttl, id: 0 }).await
    }

    /// Opens a keep-alive stream for lease `id` and sends the first keep-alive.
    pub async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> Result<Duplex<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>, Error> {
        self.duplex(LEASE_KEEP_ALIVE, pb::LeaseKeepAliveRequest { id }).await
    }

    /// Opens a watch of every key starting with `prefix`.
    pub async fn watch_prefix(&self, prefix: &[u8]) -> Result<Streaming<pb::WatchResponse>, Error> {
        let create = pb::WatchCreateRequest { key: prefix.to_vec(), range_end: prefix_end(prefix), start_revision: 0 };
        let first = pb::WatchRequest { request_union: Some(pb::WatchRequestUnion::CreateRequest(create)) };
        // The sender stays open as long as the stream is read: a closed request stream
        // would end the watch. It lives in the stream's task, dropped with it.
        let (tx, stream) = self.duplex::<_, pb::WatchResponse>(WATCH, first).await?;
        tokio::spawn(async move { tx.closed().await });
        Ok(stream)
    }

    /// The status of the member the connection reaches (its version, its leader, among others).
    #[cfg(test)]
    pub async fn status(&self) -> Result<pb::StatusResponse, Error> {
        self.unary(STATUS, pb::StatusRequest {}).await
    }
}

/// Whether `s` says the auth token is no longer valid (etcd drops idle tokens).
fn token_expired(s: &Status) -> bool {
    s.message().contains("invalid auth token")
}

/// Transaction building, in the shape etcd's API has.
pub mod txn {
    use super::pb::{self, CompareResult, CompareTarget, TargetUnion};

    /// Compares the key's create revision.
    pub fn create_revision_is(key: &[u8], rev: i64) -> pb::Compare {
        cmp(key, CompareTarget::Create, TargetUnion::CreateRevision(rev))
    }

    /// Compares the key's mod revision.
    pub fn mod_revision_is(key: &[u8], rev: i64) -> pb::Compare {
        cmp(key, CompareTarget::Mod, TargetUnion::ModRevision(rev))
    }

    /// Compares the etcd lease the key is bound to (0: none, or no key).
    pub fn lease_is(key: &[u8], lease: i64) -> pb::Compare {
        cmp(key, CompareTarget::Lease, TargetUnion::Lease(lease))
    }

    /// Compares the key's value.
    pub fn value_is(key: &[u8], value: Vec<u8>) -> pb::Compare {
        cmp(key, CompareTarget::Value, TargetUnion::Value(value))
    }

    fn cmp(key: &[u8], target: CompareTarget, union: TargetUnion) -> pb::Compare {
        pb::Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            target_union: Some(union),
        }
    }

    /// Writes `value` to `key` bound to `lease`; `None` keeps the stored value.
    pub fn put(key: &[u8], value: Option<Vec<u8>>, lease: i64) -> pb::RequestOp {
        let ignore_value = value.is_none();
        op(pb::Request::Put(pb::PutRequest {
            key: key.to_vec(),
            value: value.unwrap_or_default(),
            lease,
            prev_kv: false,
            ignore_value,
            ignore_lease: false,
        }))
    }

    /// Reads `key`.
    pub fn get(key: &[u8]) -> pb::RequestOp {
        op(pb::Request::Range(pb::RangeRequest { key: key.to_vec(), range_end: Vec::new() }))
    }

    /// Deletes `key`.
    pub fn delete(key: &[u8]) -> pb::RequestOp {
        op(pb::Request::DeleteRange(pb::DeleteRangeRequest {
            key: key.to_vec(),
            range_end: Vec::new(),
            prev_kv: false,
        }))
    }

    /// A nested transaction.
    pub fn nested(t: pb::TxnRequest) -> pb::RequestOp {
        op(pb::Request::Txn(t))
    }

    fn op(r: pb::Request) -> pb::RequestOp {
        pb::RequestOp { request: Some(r) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn prefix_ends_cover_exactly_the_prefix() {
        assert_eq!(prefix_end(b"tenure/lease/"), b"tenure/lease0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn messages_use_etcds_field_numbers() {
        // A put of key "k" with value "v" on lease 7, as etcd's schema encodes it:
        // field 1 (bytes) "k", field 2 (bytes) "v", field 3 (varint) 7.
        let put = pb::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), lease: 7, ..Default::default() };
        assert_eq!(put.encode_to_vec(), vec![0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 7]);
        // A compare of the create revision (target 1) with the value 5 in field 5.
        let c = txn::create_revision_is(b"k", 5);
        assert_eq!(c.encode_to_vec(), vec![0x10, 1, 0x1a, 1, b'k', 0x28, 5]);
        // Fields a newer server adds are skipped.
        let mut raw = pb::LeaseKeepAliveResponse { header: None, id: 9, ttl: 3 }.encode_to_vec();
        raw.extend_from_slice(&[0xa0, 0x06, 1]); // field 100, varint 1
        assert_eq!(pb::LeaseKeepAliveResponse::decode(raw.as_slice()).unwrap().ttl, 3);
    }
}
