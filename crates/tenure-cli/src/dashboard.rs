//! `tenure dashboard --http ADDR`: one page, no external assets, that lists every
//! election on the store with its leader, token and a countdown to expiry, updated live
//! (server-sent events), with a timeline of leader changes since the page opened. Read
//! only: nothing here changes state.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tenure::LeaseStore;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::http::{Get, read_get, respond};

/// Most pages following the live view at once: each costs a store read every
/// [`REFRESH`], and together they leave room under [`crate::http::MAX_CONNECTIONS`] for
/// everything else.
const MAX_EVENT_STREAMS: usize = crate::http::MAX_CONNECTIONS / 2;

const PAGE: &str = include_str!("dashboard.html");

/// How often the store is read for the live view.
const REFRESH: Duration = Duration::from_millis(250);

/// Every election under `prefix` with its leader, as `tenure list --json` prints them.
async fn snapshot(store: &dyn LeaseStore, prefix: &str) -> Result<Value, String> {
    let mut recs = store.list(prefix).await.map_err(|e| format!("{e:#}"))?;
    recs.retain(|r| crate::inspect::listed(r, prefix));
    let all: Vec<Value> = recs.iter().map(|r| crate::inspect::status_json(r.election.as_str(), Some(r))).collect();
    Ok(json!({ "elections": all }))
}

/// Serves the page until SIGINT or SIGTERM.
pub async fn dashboard(store: Arc<dyn LeaseStore>, addr: SocketAddr, prefix: String) -> Result<i32> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr} (--http)"))?;
    let bound = listener.local_addr()?;
    println!("dashboard on http://{bound}/");
    let stop = crate::run::stop_on_signals()?;
    let prefix = Arc::new(prefix);
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_EVENT_STREAMS));
    let serve = crate::http::accept_loop(listener, move |conn| {
        let (store, prefix, streams) = (store.clone(), prefix.clone(), streams.clone());
        async move {
            let _ = serve_one(conn, store.as_ref(), &prefix, bound, &streams).await;
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
    store: &dyn LeaseStore,
    prefix: &str,
    bound: SocketAddr,
    streams: &Arc<tokio::sync::Semaphore>,
) -> std::io::Result<()> {
    let Some(Get { path, host, .. }) = read_get(&mut conn).await? else { return Ok(()) };
    if !host_allowed(host.as_deref(), bound) {
        return respond(&mut conn, 403, "text/plain", "the Host header must name this address\n").await;
    }
    if path == "/events" {
        // Long-lived: no time limit, but only so many at once.
        return match streams.clone().try_acquire_owned() {
            Ok(_stream) => events(&mut conn, store, prefix).await,
            Err(_) => respond(&mut conn, 503, "text/plain", "too many live views open; try again later\n").await,
        };
    }
    let answer = async {
        match path.as_str() {
            "/" => respond(&mut conn, 200, "text/html; charset=utf-8", PAGE).await,
            "/api/elections" => match snapshot(store, prefix).await {
                Ok(v) => respond(&mut conn, 200, "application/json", &(v.to_string() + "\n")).await,
                Err(e) => {
                    respond(&mut conn, 503, "application/json", &(json!({ "error": e }).to_string() + "\n")).await
                }
            },
            _ => respond(&mut conn, 404, "text/plain", "not found\n").await,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answer).await.unwrap_or(Ok(()))
}

/// A server-sent event stream: the snapshot whenever it changes, and at least every few
/// seconds (so the page knows the server is there), until the page goes away.
async fn events(conn: &mut TcpStream, store: &dyn LeaseStore, prefix: &str) -> std::io::Result<()> {
    conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )
    .await?;
    let mut last = String::new();
    let mut quiet = Duration::ZERO;
    loop {
        let data = match snapshot(store, prefix).await {
            Ok(v) => v.to_string(),
            Err(e) => json!({ "error": e }).to_string(),
        };
        // Countdowns move on every read: send when who leads changes, else now and then.
        let key = strip_countdowns(&data);
        if key != last || quiet >= Duration::from_secs(2) {
            conn.write_all(format!("data: {data}\n\n").as_bytes()).await?;
            last = key;
            quiet = Duration::ZERO;
        }
        tokio::time::sleep(REFRESH).await;
        quiet += REFRESH;
    }
}

/// The snapshot without its time-dependent fields, to tell real changes apart.
fn strip_countdowns(data: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(data) else { return data.to_string() };
    if let Some(all) = v["elections"].as_array_mut() {
        for e in all {
            if let Some(l) = e["leader"].as_object_mut() {
                l.remove("expires_in_ms");
                l.remove("renewed_at");
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
