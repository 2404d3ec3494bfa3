//! A small TCP proxy for fault tests: pass traffic, cut it, black-hole it, delay it, hold
//! the server's answers, strand the connections open now, or answer every request itself.
//!
//! It runs on a thread of its own, so that a test or tool without an async runtime can
//! use it.
//!
//! ```no_run
//! use std::time::Duration;
//! use tenure_testkit::proxy::{Mode, Proxy};
//! let proxy = Proxy::start(("127.0.0.1", 5432)).unwrap();
//! // connect clients to 127.0.0.1:proxy.port() instead of 5432, then:
//! proxy.set(Mode::Delay(Duration::from_millis(200)));
//! proxy.set(Mode::Cut);
//! ```

use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Close every connection and refuse new ones (a cable pulled, a host down).
    Cut,
    /// Keep connections open but forward nothing until the mode changes (packets dropped
    /// while TCP retransmits them): what was sent arrives late once it passes again.
    BlackHole,
    /// Forward every chunk after this delay.
    Delay(Duration),
    /// Forward requests but hold every answer (the server's bytes) until the mode
    /// changes: what a client sends before it has an answer reaches the server, what it
    /// would send after one does not.
    HoldAnswers,
    /// Hold every connection open now forever (a server host that vanished: nothing
    /// answers, nothing resets), and pass new ones (the server is back at the same
    /// address, as after a failover to a new host). Connections stranded stay so when the
    /// mode changes again, and stay open when the server closes its end; a cut (or
    /// `Answer`) closes them, and so does their client.
    Strand,
    /// Answer every request with these bytes (a whole HTTP response, with `Connection:
    /// close`) without passing it on, then close: a service that throttles or fails in
    /// front of a healthy one. Open connections are closed, so clients reconnect to it.
    Answer(&'static [u8]),
}

/// A running proxy; dropping it stops it.
pub struct Proxy {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    /// How many times [`Mode::Strand`] was set: a connection opened before the last one
    /// is stranded.
    strands: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Proxy {
    /// Starts a proxy on a free 127.0.0.1 port that forwards to `target`.
    pub fn start(target: impl ToSocketAddrs) -> std::io::Result<Self> {
        let target: SocketAddr = target
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::other("the proxy target does not resolve"))?;
        // A port no live process using the test kit was given (see `servers::claim`).
        let (listener, port) = loop {
            let listener = StdListener::bind("127.0.0.1:0")?;
            let port = listener.local_addr()?.port();
            if crate::servers::claim(port) {
                break (listener, port);
            }
        };
        listener.set_nonblocking(true)?;
        let mode = Arc::new(Mutex::new(Mode::Pass));
        let strands = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let (m, st) = (mode.clone(), strands.clone());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("tenure-proxy".into()).spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else { return };
                tokio::select! {
                    _ = stopped => {}
                    _ = accept_loop(listener, target, m, st) => {}
                }
            })
        })?;
        Ok(Self { port, mode, strands, stop: Some(stop) })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Changes what the proxy does, for open connections and new ones.
    pub fn set(&self, mode: Mode) {
        let mut m = self.mode.lock().unwrap_or_else(|p| p.into_inner());
        if mode == Mode::Strand {
            self.strands.fetch_add(1, Ordering::SeqCst);
        }
        *m = mode;
    }

    /// What the proxy does now.
    pub fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn current(mode: &Mutex<Mode>) -> Mode {
    *mode.lock().unwrap_or_else(|p| p.into_inner())
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: Arc<Mutex<Mode>>, strands: Arc<AtomicU64>) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        let conn = Conn { strands: strands.clone(), born: strands.load(Ordering::SeqCst) };
        match current(&mode) {
            Mode::Cut => {
                drop(client);
                continue;
            }
            Mode::Answer(reply) => {
                tokio::spawn(answer(client, reply));
                continue;
            }
            _ => {}
        }
        let mode = mode.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else { return };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::select! {
                _ = pump(cr, sw, mode.clone(), &conn, false) => {}
                _ = pump(sr, cw, mode, &conn, true) => {}
            }
        });
    }
}

/// Reads a request's head (up to its blank line), sends `reply` and closes.
async fn answer(mut client: TcpStream, reply: &'static [u8]) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = client.write_all(reply).await;
    let _ = client.shutdown().await;
}

/// One proxied connection: stranded once [`Mode::Strand`] is set after it was opened.
struct Conn {
    strands: Arc<AtomicU64>,
    born: u64,
}

impl Conn {
    fn stranded(&self) -> bool {
        self.strands.load(Ordering::SeqCst) > self.born
    }
}

/// Copies one direction (`answers`: the server's), applying the mode to every chunk;
/// ends on a cut or a close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: Arc<Mutex<Mode>>,
    conn: &Conn,
    answers: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            // Notice a cut even on an idle connection.
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                if matches!(current(&mode), Mode::Cut | Mode::Answer(_)) { return }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => {
                // A host that vanished sends no close: a stranded connection whose
                // server closed stays open to its client.
                while answers && conn.stranded() && !matches!(current(&mode), Mode::Cut | Mode::Answer(_)) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                return;
            }
            Ok(n) => n,
        };
        if conn.stranded() {
            // Nothing gets through, ever; reading on notices the client's close.
            continue;
        }
        // A black hole holds the bytes, as a network that drops packets does while TCP
        // retransmits them: they arrive late, in order, once it heals, or never if it is
        // cut. (Dropping them would corrupt the byte stream, which TCP never does, and
        // leave a pipelining client such as Redis's matching answers to the wrong requests.)
        while current(&mode) == Mode::BlackHole || (answers && current(&mode) == Mode::HoldAnswers) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match current(&mode) {
            Mode::Cut | Mode::Answer(_) => return,
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Pass | Mode::BlackHole | Mode::HoldAnswers | Mode::Strand => {}
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
