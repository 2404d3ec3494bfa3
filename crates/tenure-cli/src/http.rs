//! `--http ADDR`: what a running `tenure run` or `tenure schedule` tells operators and
//! load balancers, on that address only. Nothing here changes state.
//!
//! - `GET /metrics`: Prometheus text (`tenure_is_leader{election="E"} 1` on the leader, 0
//!   elsewhere, and the rest of the runtime's metrics);
//! - `GET /healthz`: 200 while the campaign works, 503 when it stopped or holds a term past
//!   its deadline without stepping down (for liveness probes);
//! - `GET /leader`: who leads, as `tenure status --json` prints it;
//! - `GET /is-leader`: 200 with this leader's token and time left, 503 elsewhere (for
//!   readiness probes and load balancers that route to the leader only). With
//!   `?wait=DUR` (at most 60 s) it is a long poll: it answers once this replica's state
//!   differs from the one the client names with `token=T` (the token it last saw, `0` for
//!   "not leading"; without it, the state when the request came), or when the wait ends.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;
use tenure::{Elector, LeaseStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Installs the Prometheus recorder; call before building the elector, whose metric
/// handles are made from it.
pub fn install_recorder() -> Result<PrometheusHandle> {
    use metrics_exporter_prometheus::Matcher;
    const STORE_CALLS: [f64; 13] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
    const TAKEOVERS: [f64; 12] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("tenure_store_request_duration_seconds".into()), &STORE_CALLS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("tenure_takeover_seconds".into()), &TAKEOVERS))
        .context("cannot set the histogram buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")
        .inspect(|_| tenure::metrics::describe())
}

/// Listens on `addr` (only there) and serves the endpoints for `elector` in the
/// background. Fails at once if the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    elector: Elector,
    store: Arc<dyn LeaseStore>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr} (--http)"))?;
    let bound = listener.local_addr()?;
    tracing::info!(%bound, "serving /metrics, /healthz, /leader and /is-leader");
    let long_polls = Arc::new(tokio::sync::Semaphore::new(MAX_LONG_POLLS));
    let state = Arc::new(State { metrics, elector, store, long_polls, last_leader: Default::default() });
    tokio::spawn(accept_loop(listener, move |conn, get| {
        let state = state.clone();
        async move {
            let _ = tokio::time::timeout(ANSWER_TIMEOUT + MAX_WAIT, answer(conn, get, &state)).await;
        }
    }));
    Ok(bound)
}

/// Most connections an `--http` address holds open at once. Beyond it, new ones wait in
/// the kernel's queue and cost this process no descriptor, so that a flood of connections
/// cannot take the descriptors that renewing the lease and stopping the command need.
pub const MAX_CONNECTIONS: usize = 128;

/// Most connections whose request head is still awaited. One more is made room for by
/// closing the one that has waited longest, once it has had [`MIN_READING`]: idle
/// connections cannot keep a probe that sends its request at once waiting in the kernel's
/// queue behind them.
pub const MAX_READING: usize = 64;

/// How long a connection is given for its request's head before it may be closed to make
/// room: a client across a network sends it within a round trip.
pub const MIN_READING: Duration = Duration::from_millis(100);

/// Longest a client may take to send its request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest a request may take, its answer included (server-sent events aside, and the
/// long poll's wait added).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait of a long poll (`/is-leader?wait=`).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// Most long polls waiting at once: the rest of [`MAX_CONNECTIONS`] stays for probes and
/// scrapes. A long poll beyond it is answered at once.
pub const MAX_LONG_POLLS: usize = 48;

/// The connections whose request head is awaited, oldest first, each with the means to
/// close it.
#[derive(Default)]
struct Reading {
    next: u64,
    queue: std::collections::VecDeque<(u64, tokio::time::Instant, tokio::sync::oneshot::Sender<()>)>,
}

/// Accepts connections on `listener` for ever, at most [`MAX_CONNECTIONS`] at once. Each
/// one's request head is read in a task of its own, within [`HEAD_TIMEOUT`] and while it
/// is among the [`MAX_READING`] newest still awaited; a GET is then handed to `serve`, and
/// anything else answered with an error. When accepting fails (no descriptor left), it
/// waits before trying again, longer each time up to a second, instead of spinning.
pub async fn accept_loop<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream, Get) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let reading = Arc::new(std::sync::Mutex::new(Reading::default()));
    let serve = Arc::new(serve);
    let mut pause = Duration::from_millis(10);
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        match listener.accept().await {
            Ok((mut conn, _)) => {
                pause = Duration::from_millis(10);
                let (close, closed) = tokio::sync::oneshot::channel();
                let id = {
                    let mut r = reading.lock().unwrap_or_else(|p| p.into_inner());
                    r.next += 1;
                    let id = r.next;
                    r.queue.push_back((id, tokio::time::Instant::now(), close));
                    id
                };
                let (waiting, serve) = (reading.clone(), serve.clone());
                tokio::spawn(async move {
                    // A head that has come is read even when the connection was just
                    // picked to close.
                    let head = tokio::select! {
                        biased;
                        head = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut conn)) => head.ok(),
                        _ = closed => None,
                    };
                    waiting.lock().unwrap_or_else(|p| p.into_inner()).queue.retain(|(i, ..)| *i != id);
                    if let Some(Ok(Some(get))) = head {
                        serve(conn, get).await;
                    }
                    drop(permit);
                });
                // Room is made by closing the longest waiting, once it has had its time;
                // until then, new connections wait in the kernel's queue.
                while !crate::term::mutant("http-idle-kept") {
                    let wait = {
                        let mut r = reading.lock().unwrap_or_else(|p| p.into_inner());
                        if r.queue.len() <= MAX_READING {
                            break;
                        }
                        let since = r.queue.front().map_or(MIN_READING, |(_, at, _)| at.elapsed());
                        if since >= MIN_READING {
                            if let Some((_, _, oldest)) = r.queue.pop_front() {
                                let _ = oldest.send(());
                            }
                            continue;
                        }
                        MIN_READING - since
                    };
                    tokio::time::sleep(wait).await;
                }
            }
            Err(e) => {
                drop(permit);
                tracing::debug!(error = %e, "accepting a connection failed; waiting {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

struct State {
    metrics: PrometheusHandle,
    elector: Elector,
    store: Arc<dyn LeaseStore>,
    long_polls: Arc<tokio::sync::Semaphore>,
    /// The last answer of `/leader`: when the store was read, its status and body.
    last_leader: tokio::sync::Mutex<Option<(tokio::time::Instant, u16, Arc<str>)>>,
}

/// How long an answer of `/leader` serves every request that comes.
const LEADER_FRESH: Duration = Duration::from_millis(100);

/// A GET request: its path and its `Host` header, if it had one.
pub struct Get {
    /// The path, without the query.
    pub path: String,
    /// The query (after `?`), or empty.
    pub query: String,
    /// The `Host` header's value.
    pub host: Option<String>,
}

async fn read_head(conn: &mut TcpStream) -> std::io::Result<Option<Get>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > 16 * 1024 {
            respond(conn, 431, "text/plain", "request head too large\n").await?;
            return Ok(None);
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        respond(conn, 405, "text/plain", "only GET\n").await?;
        return Ok(None);
    }
    let host = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("host"))
        .map(|(_, v)| v.trim().to_string());
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Ok(Some(Get { path: path.to_string(), query: query.to_string(), host }))
}

/// Answers one request; one request per connection.
async fn answer(mut conn: TcpStream, Get { path, query, .. }: Get, state: &State) -> std::io::Result<()> {
    match path.as_str() {
        "/metrics" => {
            let text = state.metrics.render();
            respond(&mut conn, 200, "text/plain; version=0.0.4", &text).await
        }
        "/healthz" => {
            if state.elector.is_healthy() {
                respond(&mut conn, 200, "text/plain", "ok\n").await
            } else {
                respond(&mut conn, 503, "text/plain", "the campaign stopped or is stuck past its deadline\n").await
            }
        }
        "/leader" => {
            let election = state.elector.election();
            // One store read at a time, and one shared by every request within
            // LEADER_FRESH of it: however many clients ask, the store (whose connection
            // the leader's renewals use too) is read at most ten times a second, and a
            // record of many megabytes (written by hand into the store) is held once.
            let (status, body) = {
                let mut last = state.last_leader.lock().await;
                match &*last {
                    Some((at, status, body)) if at.elapsed() < LEADER_FRESH => (*status, body.clone()),
                    _ => {
                        // With several holders, every holder beside the (absent) single lease.
                        let read = async {
                            let rec = state.store.get(election).await?;
                            let holders = match state.elector.config().holders {
                                1 => None,
                                _ => Some(tenure::holders::holders(&*state.store, election).await?),
                            };
                            Ok::<_, tenure::StoreError>((rec, holders))
                        };
                        let (status, body) = match read.await {
                            Ok((rec, holders)) => {
                                let mut v = crate::inspect::status_json_for_http(election.as_str(), rec.as_ref());
                                if let Some(holders) = holders {
                                    v["holders"] = holders
                                        .iter()
                                        .map(|h| {
                                            let shown = crate::inspect::status_json_for_http("", Some(&h.record));
                                            let mut l = shown["leader"].clone();
                                            l["token"] = json!(h.token.0);
                                            l["index"] = json!(h.index);
                                            l
                                        })
                                        .collect();
                                }
                                (200, v.to_string() + "\n")
                            }
                            Err(e) => (
                                503,
                                json!({ "election": election.as_str(), "error": format!("{e:#}") }).to_string() + "\n",
                            ),
                        };
                        let body: Arc<str> = Arc::from(body);
                        *last = Some((tokio::time::Instant::now(), status, body.clone()));
                        (status, body)
                    }
                }
            };
            respond(&mut conn, status, "application/json", &body).await
        }
        "/is-leader" => {
            let poll = match LongPoll::parse(&query) {
                Ok(p) => p,
                Err(why) => return respond(&mut conn, 400, "text/plain", &format!("{why}\n")).await,
            };
            if let Some(poll) = poll {
                // Beyond the long polls' share of the connections: answered at once.
                if let Ok(_slot) = state.long_polls.clone().try_acquire_owned() {
                    poll.wait(&state.elector).await;
                }
            }
            is_leader(&mut conn, state).await
        }
        _ => respond(&mut conn, 404, "text/plain", "not found: try /metrics, /healthz, /leader, /is-leader\n").await,
    }
}

/// This replica's token if it leads now, 0 if not.
fn token_now(elector: &Elector) -> u64 {
    elector.current().map_or(0, |l| l.token().0)
}

/// A long poll's wait (`/is-leader?wait=DUR[&token=T]`).
struct LongPoll {
    wait: Duration,
    /// The state the client knows: a token, or 0 for "not leading".
    known: Option<u64>,
}

impl LongPoll {
    /// `None` without `wait=`; an error for a bad or unknown parameter.
    fn parse(query: &str) -> Result<Option<Self>, String> {
        let (mut wait, mut known) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("wait", v)) => {
                    let d = humantime::parse_duration(v)
                        .map_err(|e| format!("wait={v:?}: {e} (write a duration such as 30s)"))?;
                    wait = Some(d.min(MAX_WAIT));
                }
                Some(("token", v)) => {
                    known =
                        Some(v.parse::<u64>().map_err(|_| format!("token={v:?}: write the token last seen, or 0"))?);
                }
                _ => return Err(format!("unknown parameter {pair:?}: /is-leader takes wait=DUR and token=T")),
            }
        }
        Ok(wait.map(|wait| LongPoll { wait, known }))
    }

    /// Returns once this replica's state differs from the one the client knows (or from
    /// the state now), or when the wait ends.
    async fn wait(self, elector: &Elector) {
        let mut events = elector.events();
        let known = self.known.unwrap_or_else(|| token_now(elector));
        let until = tokio::time::Instant::now() + self.wait;
        while token_now(elector) == known {
            // Woken by the runtime's events; looked at again every second besides, for a
            // term that ran out without one.
            let next = until.min(tokio::time::Instant::now() + Duration::from_secs(1));
            tokio::select! {
                _ = events.recv() => {}
                _ = tokio::time::sleep_until(next) => {}
            }
            if tokio::time::Instant::now() >= until {
                return;
            }
        }
    }
}

/// Answers `/is-leader` with this replica's state now.
async fn is_leader(conn: &mut TcpStream, state: &State) -> std::io::Result<()> {
    match state.elector.current() {
        Some(l) => {
            let body = json!({
                "election": l.election().as_str(),
                "holder": l.holder().as_str(),
                "token": l.token().0,
                "holder_index": l.holder_index(),
                "holders": l.holders(),
                "remaining_ms": l.remaining().as_millis() as u64,
            })
            .to_string();
            respond(conn, 200, "application/json", &(body + "\n")).await
        }
        None => {
            let body = json!({ "election": state.elector.election().as_str(), "leader": false }).to_string();
            respond(conn, 503, "application/json", &(body + "\n")).await
        }
    }
}

/// Sends a whole response and closes.
pub async fn respond(conn: &mut TcpStream, status: u16, content_type: &str, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}
