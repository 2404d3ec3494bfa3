//! `tenure dashboard --http ADDR`: one page, no external assets, that lists every
//! election on the store with its leader, token, how long it has led, its candidates and
//! a countdown to expiry, updated live (server-sent events), a leader that has stopped
//! renewing marked as such, and a timeline of the leader changes this server has seen
//! (kept here, so a reload keeps it). One task reads the store for every open page. Read
//! only: nothing here changes state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tenure::LeaseStore;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::http::{Get, respond};

/// Most pages following the live view at once: each costs a store read every
/// [`REFRESH`], and together they leave room under [`crate::http::MAX_CONNECTIONS`] for
/// everything else.
const MAX_EVENT_STREAMS: usize = 32;

const PAGE: &str = include_str!("dashboard.html");

/// How often the store is read for the live view.
const REFRESH: Duration = Duration::from_millis(250);

/// How many leader changes the board keeps per election.
const HISTORY: usize = 50;

/// How often the candidates of each election are counted (one store read each).
const CANDIDATES_EVERY: u32 = 8;

/// What the dashboard has seen of the store: the latest snapshot the pages get, and per
/// election the changes of leader since this server started.
#[derive(Default)]
struct Board {
    /// The latest snapshot, as the pages get it (`None` before the first read): made
    /// once per read of the store and shared by every page, whatever their number.
    snapshot: Option<Arc<str>>,
    /// Counts the snapshots that differ in more than their countdowns: a live view sends
    /// when it moves on.
    version: u64,
    /// The last snapshot without its countdowns (see [`strip_countdowns`]).
    key: String,
    /// Whether the snapshot is an error (the store could not be read).
    failed: bool,
    tracks: std::collections::BTreeMap<String, Track>,
}

impl Board {
    /// Makes `v` the snapshot the pages get.
    fn publish(&mut self, v: &Value) {
        let key = strip_countdowns(v);
        if key != self.key {
            self.key = key;
            self.version += 1;
        }
        self.failed = v.get("error").is_some();
        self.snapshot = Some(Arc::from(v.to_string()));
    }
}

#[derive(Default)]
struct Track {
    /// `{at_ms, holder, token}` (holder and token `null`: nobody led), oldest first.
    history: std::collections::VecDeque<Value>,
    candidates: Option<usize>,
}

/// A leader that has not renewed on time: less than half its TTL left, where a leader
/// that renews (every third of the TTL) keeps at least two thirds. It may be dead, frozen
/// or cut off from the store; its lease still holds until it runs out.
fn late(r: &tenure::LeaseRecord) -> bool {
    r.remaining.is_some_and(|left| left * 2 < r.ttl)
}

/// Reads the store every [`REFRESH`] for as long as the dashboard runs, and keeps
/// `board` up to date.
async fn watch_store(store: Arc<dyn LeaseStore>, prefix: Arc<String>, board: Arc<std::sync::Mutex<Board>>) {
    let mut round: u32 = 0;
    loop {
        let read = crate::inspect::rows(&*store, &prefix).await;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let count = round.is_multiple_of(CANDIDATES_EVERY);
        round = round.wrapping_add(1);
        let recs = match read {
            Ok(r) => r,
            Err(e) => {
                board.lock().unwrap_or_else(|p| p.into_inner()).publish(&json!({ "error": format!("{e:#}") }));
                tokio::time::sleep(REFRESH).await;
                continue;
            }
        };
        let mut candidates = std::collections::HashMap::new();
        if count {
            for (e, _, _) in &recs {
                if candidates.contains_key(e) {
                    continue;
                }
                let Ok(name) = tenure::ElectionName::new(e) else { continue };
                if let Ok(c) = tenure::candidates(&*store, &name).await {
                    candidates.insert(e.clone(), c.len());
                }
            }
        }
        record(&mut board.lock().unwrap_or_else(|p| p.into_inner()), &recs, &candidates, now_ms);
        tokio::time::sleep(REFRESH).await;
    }
}

/// Adds what one read of the store found (`recs`, and the candidates counted, if they
/// were) to the board, and makes the pages' snapshot.
fn record(
    board: &mut Board,
    recs: &[crate::inspect::Row],
    candidates: &std::collections::HashMap<String, usize>,
    now_ms: u64,
) {
    {
        let tracks = &mut board.tracks;
        let mut seen = std::collections::BTreeSet::new();
        for (e, i, r) in recs {
            // One holder of an election with several is a row of its own: `name [index]`.
            let name = crate::inspect::row_name(e, *i);
            let t = tracks.entry(name.clone()).or_default();
            let change = json!({ "at_ms": now_ms, "holder": r.holder.as_str(), "token": r.token.0 });
            let last = t.history.back();
            if last.is_none_or(|l| l["holder"] != change["holder"] || l["token"] != change["token"]) {
                t.history.push_back(change);
            }
            if let Some(c) = candidates.get(e) {
                t.candidates = Some(*c);
            }
            seen.insert(name);
        }
        for (_, t) in tracks.iter_mut().filter(|(n, _)| !seen.contains(*n)) {
            if t.history.back().is_some_and(|l| !l["holder"].is_null()) {
                t.history.push_back(json!({ "at_ms": now_ms, "holder": null, "token": null }));
            }
        }
        for t in tracks.values_mut() {
            while t.history.len() > HISTORY {
                t.history.pop_front();
            }
        }
        let by_name: std::collections::HashMap<String, &tenure::LeaseRecord> =
            recs.iter().map(|(e, i, r)| (crate::inspect::row_name(e, *i), r)).collect();
        let all: Vec<Value> = tracks
            .iter()
            .map(|(name, t)| {
                let rec = by_name.get(name.as_str()).copied();
                // Metadata cut to a few KiB: a record of many megabytes would otherwise be
                // sent to every open page four times a second.
                let mut v = crate::inspect::status_json_for_http(name, rec);
                if let (Some(r), Some(leader)) = (rec, v["leader"].as_object_mut()) {
                    leader.insert("ttl_ms".into(), json!(r.ttl.as_millis() as u64));
                    leader.insert("late".into(), json!(late(r)));
                }
                v["candidates"] = json!(t.candidates);
                v["history"] = Value::Array(t.history.iter().cloned().collect());
                v
            })
            .collect();
        let all = json!({ "elections": all });
        board.publish(&all);
    }
}

/// The board's latest snapshot, its version and whether it is an error; `None` before
/// the store was first read.
fn latest(board: &std::sync::Mutex<Board>) -> Option<(Arc<str>, u64, bool)> {
    let b = board.lock().unwrap_or_else(|p| p.into_inner());
    b.snapshot.clone().map(|s| (s, b.version, b.failed))
}

/// Serves the page until SIGINT or SIGTERM.
pub async fn dashboard(store: Arc<dyn LeaseStore>, addr: SocketAddr, prefix: String) -> Result<i32> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr} (--http)"))?;
    let bound = listener.local_addr()?;
    println!("dashboard on http://{bound}/");
    let stop = crate::run::stop_on_signals()?;
    let prefix = Arc::new(prefix);
    let board = Arc::new(std::sync::Mutex::new(Board::default()));
    tokio::spawn(watch_store(store, prefix, board.clone()));
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_EVENT_STREAMS));
    let serve = crate::http::accept_loop(listener, move |conn, get| {
        let (board, streams) = (board.clone(), streams.clone());
        async move {
            let _ = serve_one(conn, get, &board, bound, &streams).await;
        }
    });
    tokio::select! {
        _ = serve => Ok(0),
        _ = stop.cancelled() => Ok(0),
    }
}

/// Whether a request naming `host` in its `Host` header may be answered by the page
/// served on `bound`: an IP address (with this port) or `localhost`. A DNS name is
/// refused: a page elsewhere whose name an attacker points at this address (DNS
/// rebinding) must not read the elections through a visitor's browser.
fn host_allowed(host: Option<&str>, bound: SocketAddr) -> bool {
    let Some(host) = host else { return false };
    let (name, port) = match host.parse::<SocketAddr>() {
        Ok(a) => return a.port() == bound.port(),
        Err(_) => match host.rsplit_once(':') {
            Some((n, p)) if !n.contains(':') || n.starts_with('[') => (n, p.parse::<u16>().ok()),
            _ => (host, None),
        },
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let ip_or_localhost = name.parse::<std::net::IpAddr>().is_ok() || name.eq_ignore_ascii_case("localhost");
    ip_or_localhost && port.is_none_or(|p| p == bound.port())
}

async fn serve_one(
    mut conn: TcpStream,
    Get { path, host, .. }: Get,
    board: &std::sync::Mutex<Board>,
    bound: SocketAddr,
    streams: &Arc<tokio::sync::Semaphore>,
) -> std::io::Result<()> {
    if !host_allowed(host.as_deref(), bound) {
        return respond(&mut conn, 403, "text/plain", "the Host header must name this address\n").await;
    }
    if path == "/events" {
        // Long-lived: no time limit, but only so many at once.
        return match streams.clone().try_acquire_owned() {
            Ok(_stream) => events(&mut conn, board).await,
            Err(_) => respond(&mut conn, 503, "text/plain", "too many live views open; try again later\n").await,
        };
    }
    let answer = async {
        match path.as_str() {
            "/" => respond(&mut conn, 200, "text/html; charset=utf-8", PAGE).await,
            "/api/elections" => match latest(board) {
                Some((v, _, false)) => respond(&mut conn, 200, "application/json", &format!("{v}\n")).await,
                Some((v, _, true)) => respond(&mut conn, 503, "application/json", &format!("{v}\n")).await,
                None => {
                    let e = json!({ "error": "the store has not been read yet" });
                    respond(&mut conn, 503, "application/json", &(e.to_string() + "\n")).await
                }
            },
            _ => respond(&mut conn, 404, "text/plain", "not found\n").await,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answer).await.unwrap_or(Ok(()))
}

/// A server-sent event stream: the snapshot whenever it changes, and at least every few
/// seconds (so the page knows the server is there), until the page goes away.
async fn events(conn: &mut TcpStream, board: &std::sync::Mutex<Board>) -> std::io::Result<()> {
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let mut last = None;
    let mut quiet = Duration::ZERO;
    loop {
        let Some((data, version, _)) = latest(board) else {
            tokio::time::sleep(REFRESH).await;
            continue;
        };
        // Countdowns move on every read: send when who leads changes, else now and then.
        if last != Some(version) || quiet >= Duration::from_secs(2) {
            conn.write_all(b"data: ").await?;
            conn.write_all(data.as_bytes()).await?;
            conn.write_all(b"\n\n").await?;
            last = Some(version);
            quiet = Duration::ZERO;
        }
        tokio::time::sleep(REFRESH).await;
        quiet += REFRESH;
    }
}

/// The snapshot without its time-dependent fields, to tell real changes apart.
fn strip_countdowns(v: &Value) -> String {
    let mut v = v.clone();
    if let Some(all) = v["elections"].as_array_mut() {
        for e in all {
            if let Some(l) = e["leader"].as_object_mut() {
                l.remove("expires_in_ms");
                l.remove("renewed_at");
            }
            if let Some(e) = e.as_object_mut() {
                // A change of leader shows in the history's entries, not in their times.
                e.remove("candidates");
            }
        }
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_an_address_or_localhost_may_name_the_dashboard() {
        let bound: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        for ok in ["127.0.0.1:8080", "127.0.0.1", "localhost:8080", "LOCALHOST", "10.0.0.5:8080", "[::1]:8080"] {
            assert!(host_allowed(Some(ok), bound), "{ok}");
        }
        for refused in ["evil.example:8080", "evil.example", "127.0.0.1:9999", "localhost:1", "127.0.0.1.nip.io:8080"] {
            assert!(!host_allowed(Some(refused), bound), "{refused}");
        }
        assert!(!host_allowed(None, bound), "a request without Host");
    }
}
