//! Transports: how a group's messages reach every worker.
//!
//! A group is one broadcast channel: everything published on it reaches every link open
//! on it at that moment, the publisher's own included, in the order each publisher sent
//! it. Nothing is stored for links that open later. [`RedisTransport`] uses Redis
//! pub/sub (channel `tenure:gossip:GROUP`); [`AmqpTransport`] a fanout exchange
//! `tenure.gossip.GROUP` with one exclusive, server-named queue per link; [`MemoryHub`]
//! stays inside the process, for tests.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::sync::{broadcast, mpsc};

use crate::{BoxError, GossipError};

/// How long a publish may take before it counts as failed.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// How long opening a link may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages a link buffers before the reader catches up.
const LINK_BUFFER: usize = 4096;

/// A way to reach a group's channel; opens links to it, again after a link is lost.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Subscribes to the group and returns a link: messages published on the group from
    /// now on arrive on [`Link::messages`], which closes when the subscription is lost.
    async fn open(&self) -> Result<Link, GossipError>;

    /// Where this transport goes, for messages (no password).
    fn describe(&self) -> String;
}

/// One open subscription to a group, and a way to publish on it.
pub struct Link {
    /// Publishes on the group.
    pub publisher: Arc<dyn Publisher>,
    /// Every message published on the group since the link opened; closed when the
    /// subscription is lost.
    pub messages: mpsc::Receiver<Vec<u8>>,
}

/// Publishes on a group.
#[async_trait]
pub trait Publisher: Send + Sync + 'static {
    /// Sends `payload` to every link open on the group (this one's included).
    async fn publish(&self, payload: Vec<u8>) -> Result<(), GossipError>;
}

/// Opens the transport a broker URL names: `redis://…` / `rediss://…` (Redis pub/sub) or
/// `amqp://USER:PASSWORD@HOST:PORT/VHOST` (AMQP 0-9-1, e.g. RabbitMQ). `group` separates
/// independent groups on one broker.
pub fn connect(url: &str, group: &str) -> Result<Arc<dyn Transport>, GossipError> {
    check_group(group)?;
    // TLS asks rustls for the process's crypto provider, which it can choose alone
    // only while one is built in (the ZooKeeper client builds in a second): ring, as
    // every store here uses; one installed already stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("redis" | "rediss") => Ok(Arc::new(RedisTransport::new(url, group)?)),
        Some("amqp") => Ok(Arc::new(AmqpTransport::new(url, group)?)),
        Some("amqps") => Err(GossipError::bad_url(url, "amqps:// (AMQP over TLS) is not supported; use amqp://")),
        _ => Err(GossipError::bad_url(url, "expected redis://, rediss:// or amqp://")),
    }
}

/// A group name: 1 to 100 characters of A-Z a-z 0-9 . _ -
fn check_group(group: &str) -> Result<(), GossipError> {
    crate::check_label("group", group, "")
}

/// An in-process group, for tests: every link opened from one hub hears every message
/// published through any of them.
#[derive(Clone)]
pub struct MemoryHub {
    tx: broadcast::Sender<Vec<u8>>,
}

impl Default for MemoryHub {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryHub {
    /// A new, empty hub.
    pub fn new() -> Self {
        Self { tx: broadcast::channel(LINK_BUFFER).0 }
    }
}

#[async_trait]
impl Transport for MemoryHub {
    async fn open(&self) -> Result<Link, GossipError> {
        let mut sub = self.tx.subscribe();
        let (tx, rx) = mpsc::channel(LINK_BUFFER);
        tokio::spawn(async move {
            // A lagging link loses messages, like a broker that drops a slow subscriber.
            while let Ok(m) = sub.recv().await {
                if tx.send(m).await.is_err() {
                    break;
                }
            }
        });
        Ok(Link { publisher: Arc::new(self.clone()), messages: rx })
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}

#[async_trait]
impl Publisher for MemoryHub {
    async fn publish(&self, payload: Vec<u8>) -> Result<(), GossipError> {
        let _ = self.tx.send(payload);
        Ok(())
    }
}

/// Redis pub/sub: the group is the channel `tenure:gossip:GROUP`.
pub struct RedisTransport {
    client: redis::Client,
    channel: String,
    shown: String,
}

impl RedisTransport {
    /// A transport for `url` (`redis://[:PASSWORD@]HOST[:PORT][/DB]`, or `rediss://`).
    pub fn new(url: &str, group: &str) -> Result<Self, GossipError> {
        check_group(group)?;
        let client = redis::Client::open(url).map_err(|e| GossipError::bad_url(url, e.to_string()))?;
        Ok(Self { client, channel: format!("tenure:gossip:{group}"), shown: tenure::store::url::redact(url) })
    }

    fn unreachable(&self, e: redis::RedisError) -> GossipError {
        GossipError::broker(format!("cannot subscribe to {} on {}", self.channel, self.shown), Box::new(e) as BoxError)
    }
}

#[async_trait]
impl Transport for RedisTransport {
    async fn open(&self) -> Result<Link, GossipError> {
        let open = async {
            let mut pubsub = self.client.get_async_pubsub().await.map_err(|e| self.unreachable(e))?;
            pubsub.subscribe(&self.channel).await.map_err(|e| self.unreachable(e))?;
            let conn = self.client.get_multiplexed_async_connection().await.map_err(|e| self.unreachable(e))?;
            Ok::<_, GossipError>((pubsub, conn))
        };
        let (pubsub, conn) = tokio::time::timeout(OPEN_TIMEOUT, open).await.map_err(|_| {
            GossipError::broker(format!("{} did not answer within {OPEN_TIMEOUT:?}", self.shown), None)
        })??;
        let (tx, rx) = mpsc::channel(LINK_BUFFER);
        tokio::spawn(async move {
            let mut stream = pubsub.into_on_message();
            while let Some(msg) = stream.next().await {
                if tx.send(msg.get_payload_bytes().to_vec()).await.is_err() {
                    break;
                }
            }
        });
        let publisher = RedisPublisher { conn, channel: self.channel.clone(), shown: self.shown.clone() };
        Ok(Link { publisher: Arc::new(publisher), messages: rx })
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }
}

struct RedisPublisher {
    conn: redis::aio::MultiplexedConnection,
    channel: String,
    shown: String,
}

#[async_trait]
impl Publisher for RedisPublisher {
    async fn publish(&self, payload: Vec<u8>) -> Result<(), GossipError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&self.channel).arg(payload);
        let publish = cmd.query_async::<i64>(&mut conn);
        match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                Err(GossipError::broker(format!("publishing on {} failed", self.shown), Box::new(e) as BoxError))
            }
            Err(_) => Err(GossipError::broker(format!("publishing on {} timed out", self.shown), None)),
        }
    }
}

/// AMQP 0-9-1 (RabbitMQ): the group is the fanout exchange `tenure.gossip.GROUP`; each link
/// binds an exclusive, server-named queue to it.
pub struct AmqpTransport {
    host: String,
    port: u16,
    user: String,
    password: String,
    vhost: String,
    exchange: String,
    shown: String,
}

impl AmqpTransport {
    /// A transport for `amqp://[USER[:PASSWORD]@]HOST[:PORT][/VHOST]` (user and password
    /// default to guest, the port to 5672, the virtual host to `/`; percent-escapes are
    /// decoded, so `%2f` is `/`).
    pub fn new(url: &str, group: &str) -> Result<Self, GossipError> {
        check_group(group)?;
        let bad = |why: &str| GossipError::bad_url(url, why);
        let rest = url.strip_prefix("amqp://").ok_or_else(|| bad("expected amqp://"))?;
        if rest.contains('?') || rest.contains('#') {
            return Err(bad("query parameters are not supported"));
        }
        let (authority, vhost) = rest.split_once('/').unwrap_or((rest, ""));
        let (creds, hostport) = authority.rsplit_once('@').map_or((None, authority), |(c, h)| (Some(c), h));
        let (user, password) = match creds {
            Some(c) => {
                let (u, p) = c.split_once(':').unwrap_or((c, ""));
                (
                    decode(u).ok_or_else(|| bad("bad percent-escape in the user"))?,
                    decode(p).ok_or_else(|| bad("bad percent-escape in the password"))?,
                )
            }
            None => ("guest".into(), "guest".into()),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad("the port is not a number from 1 to 65535"))?),
            None => (hostport, 5672),
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let vhost = if vhost.is_empty() {
            "/".into()
        } else {
            decode(vhost).ok_or_else(|| bad("bad percent-escape in the virtual host"))?
        };
        Ok(Self {
            host: host.trim_start_matches('[').trim_end_matches(']').to_string(),
            port,
            user,
            password,
            vhost,
            exchange: format!("tenure.gossip.{group}"),
            shown: tenure::store::url::redact(url),
        })
    }
}

/// Decodes %XX escapes.
fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[async_trait]
impl Transport for AmqpTransport {
    async fn open(&self) -> Result<Link, GossipError> {
        use amqprs::channel::{
            BasicConsumeArguments, ExchangeDeclareArguments, QueueBindArguments, QueueDeclareArguments,
        };
        use amqprs::connection::{Connection, OpenConnectionArguments};
        let fail = |what: &str, e: amqprs::error::Error| {
            GossipError::broker(format!("{what} on {} failed", self.shown), Box::new(e) as BoxError)
        };
        let open = async {
            let mut args = OpenConnectionArguments::new(&self.host, self.port, &self.user, &self.password);
            args.virtual_host(&self.vhost).heartbeat(10);
            let conn = Connection::open(&args).await.map_err(|e| {
                // RabbitMQ answers a wrong user, password or virtual host by closing the socket.
                let reset = e.to_string().contains("reset by peer");
                let what = if reset {
                    "connecting (the broker closed the connection: a wrong user, password or virtual host?)"
                } else {
                    "connecting"
                };
                fail(what, e)
            })?;
            let sub = conn.open_channel(None).await.map_err(|e| fail("opening a channel", e))?;
            sub.exchange_declare(ExchangeDeclareArguments::new(&self.exchange, "fanout"))
                .await
                .map_err(|e| fail("declaring the exchange", e))?;
            let (queue, _, _) = sub
                .queue_declare(QueueDeclareArguments::exclusive_server_named())
                .await
                .map_err(|e| fail("declaring a queue", e))?
                .ok_or_else(|| GossipError::broker(format!("{} named no queue", self.shown), None))?;
            sub.queue_bind(QueueBindArguments::new(&queue, &self.exchange, ""))
                .await
                .map_err(|e| fail("binding the queue", e))?;
            let (_, consumer) = sub
                .basic_consume_rx(BasicConsumeArguments::new(&queue, "").auto_ack(true).finish())
                .await
                .map_err(|e| fail("consuming", e))?;
            let publish = conn.open_channel(None).await.map_err(|e| fail("opening a channel", e))?;
            Ok::<_, GossipError>((conn, sub, publish, consumer))
        };
        let (conn, sub, channel, mut consumer) = tokio::time::timeout(OPEN_TIMEOUT, open).await.map_err(|_| {
            GossipError::broker(format!("{} did not answer within {OPEN_TIMEOUT:?}", self.shown), None)
        })??;
        let (tx, rx) = mpsc::channel(LINK_BUFFER);
        let watched = conn.clone();
        tokio::spawn(async move {
            let _sub = sub;
            let failed = watched.listen_network_io_failure();
            tokio::pin!(failed);
            loop {
                tokio::select! {
                    m = consumer.recv() => match m {
                        Some(m) => {
                            if let Some(content) = m.content
                                && tx.send(content).await.is_err()
                            {
                                break;
                            }
                        }
                        None => break,
                    },
                    _ = &mut failed => break,
                }
                if !watched.is_open() {
                    break;
                }
            }
        });
        let publisher =
            AmqpPublisher { _conn: conn, channel, exchange: self.exchange.clone(), shown: self.shown.clone() };
        Ok(Link { publisher: Arc::new(publisher), messages: rx })
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }
}

struct AmqpPublisher {
    _conn: amqprs::connection::Connection,
    channel: amqprs::channel::Channel,
    exchange: String,
    shown: String,
}

#[async_trait]
impl Publisher for AmqpPublisher {
    async fn publish(&self, payload: Vec<u8>) -> Result<(), GossipError> {
        let args = amqprs::channel::BasicPublishArguments::new(&self.exchange, "");
        let publish = self.channel.basic_publish(amqprs::BasicProperties::default(), payload, args);
        match tokio::time::timeout(PUBLISH_TIMEOUT, publish).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                Err(GossipError::broker(format!("publishing on {} failed", self.shown), Box::new(e) as BoxError))
            }
            Err(_) => Err(GossipError::broker(format!("publishing on {} timed out", self.shown), None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls_are_checked() {
        assert!(connect("redis://127.0.0.1:6379", "default").is_ok());
        assert!(connect("amqp://guest:guest@127.0.0.1:5672/%2f", "default").is_ok());
        for (url, says) in [
            ("http://x", "expected redis://"),
            ("amqps://h", "not supported"),
            ("amqp://h:notaport", "port"),
            ("amqp://u:p@:5672", "no host"),
            ("amqp://h/%zz", "percent-escape"),
        ] {
            let e = connect(url, "default").err().unwrap_or_else(|| panic!("{url} was accepted")).to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
        let e = connect("redis://127.0.0.1", "bad group!").err().unwrap().to_string();
        assert!(e.contains("invalid group"), "{e}");
    }

    #[test]
    fn amqp_urls_are_parsed_with_defaults() {
        let t = AmqpTransport::new("amqp://bob:s%40cret@broker:5673/jobs%2fa", "g").unwrap();
        assert_eq!((t.host.as_str(), t.port, t.user.as_str(), t.password.as_str()), ("broker", 5673, "bob", "s@cret"));
        assert_eq!(t.vhost, "jobs/a");
        assert_eq!(t.exchange, "tenure.gossip.g");
        assert_eq!(t.describe(), "amqp://bob:***@broker:5673/jobs%2fa");
        let t = AmqpTransport::new("amqp://broker", "g").unwrap();
        assert_eq!((t.port, t.user.as_str(), t.vhost.as_str()), (5672, "guest", "/"));
    }
}

#[cfg(test)]
mod fuzz {
    //! Fuzz target for the AMQP URL parser: arbitrary input never panics, and a refusal
    //! never prints the password.
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn amqp_urls_never_panic_and_refusals_hide_the_password(
            pw in "[a-z]{10}",
            rest in "[ -~]{0,50}",
            any in any::<String>(),
        ) {
            let url = format!("amqp://u:{pw}@{rest}");
            if let Err(e) = super::AmqpTransport::new(&url, "g") {
                prop_assert!(!e.to_string().contains(&pw), "{}", e);
            }
            let _ = super::AmqpTransport::new(&any, "g");
            let _ = super::decode(&any);
        }
    }
}
