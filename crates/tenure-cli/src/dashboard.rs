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

use crate::http::{read_get, respond};

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
    loop {
        let conn = tokio::select! {
            c = listener.accept() => match c {
                Ok((conn, _)) => conn,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return Ok(0),
        };
        let (store, prefix) = (store.clone(), prefix.clone());
        tokio::spawn(async move {
            let _ = serve_one(conn, store.as_ref(), &prefix).await;
        });
    }
}

async fn serve_one(mut conn: TcpStream, store: &dyn LeaseStore, prefix: &str) -> std::io::Result<()> {
    let read = tokio::time::timeout(Duration::from_secs(10), read_get(&mut conn)).await;
    let Ok(Ok(Some(path))) = read else { return Ok(()) };
    match path.as_str() {
        "/" => respond(&mut conn, 200, "text/html; charset=utf-8", PAGE).await,
        "/api/elections" => match snapshot(store, prefix).await {
            Ok(v) => respond(&mut conn, 200, "application/json", &(v.to_string() + "\n")).await,
            Err(e) => respond(&mut conn, 503, "application/json", &(json!({ "error": e }).to_string() + "\n")).await,
        },
        "/events" => events(conn, store, prefix).await,
        _ => respond(&mut conn, 404, "text/plain", "not found\n").await,
    }
}

/// A server-sent event stream: the snapshot whenever it changes, and at least every few
/// seconds (so the page knows the server is there), until the page goes away.
async fn events(mut conn: TcpStream, store: &dyn LeaseStore, prefix: &str) -> std::io::Result<()> {
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
