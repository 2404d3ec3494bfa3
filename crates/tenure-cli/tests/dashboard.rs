//! `tenure dashboard` in a real browser: headless Chromium (Debian's `chromium`), driven
//! through its DevTools protocol, watches a leader change live on one open page.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tenure_testkit::servers;

mod common;
use common::{Proc, name_of, tenure};

/// A GET on 127.0.0.1:`port`: the body, read up to its Content-Length (DevTools keeps
/// the connection open) or to the end.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).ok()?;
        data.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&data).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                .and_then(|v| v.parse::<usize>().ok());
            if n == 0 || length.is_some_and(|len| body.len() >= len) {
                return Some(body.to_string());
            }
        }
        if n == 0 {
            return None;
        }
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < limit, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn leader(dir: &Path, election: &str, id: &str) -> Proc {
    let child = Command::new(tenure())
        .env("TENURE_STORE", format!("sqlite:{}", dir.join("s.db").display()))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .args(["run", election, "--id", id, "--ttl", "3s", "--metadata", &format!("{id}.example:8080")])
        .args(["--", "sleep", "600"])
        .spawn()
        .unwrap();
    Proc(child)
}

/// `tenure dashboard` on the store in `dir`, on a free port.
fn dashboard(dir: &Path) -> (Proc, u16) {
    let port = servers::free_port();
    let dash = Proc(
        Command::new(tenure())
            .env("TENURE_STORE", format!("sqlite:{}", dir.join("s.db").display()))
            .args(["dashboard", "--http", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (dash, port)
}

/// A page in Chromium, reached through the DevTools protocol.
struct Page {
    ws: tungstenite::WebSocket<TcpStream>,
    next: u64,
}

impl Page {
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.ws
            .send(tungstenite::Message::text(json!({"id": id, "method": method, "params": params}).to_string()))
            .unwrap();
        loop {
            let m = self.ws.read().unwrap();
            if let Ok(v) = serde_json::from_str::<Value>(m.to_text().unwrap_or(""))
                && v["id"] == id
            {
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `js` in the page and returns its value.
    fn eval(&mut self, js: &str) -> Value {
        self.call("Runtime.evaluate", json!({"expression": js, "returnByValue": true}))["result"]["value"].clone()
    }
}

/// Headless Chromium showing the dashboard on `port`, and its page.
fn open_page(chromium: &Path, dir: &Path, port: u16) -> (Proc, Page) {
    let devtools = servers::free_port();
    let browser = Proc(
        Command::new(chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1100,640"])
            // Nothing but the page: no updater, sync or QUIC connections, which a machine
            // without outside network refuses or leaves hanging, and shared memory in
            // files where /dev/shm is small.
            .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
            .args(["--disable-quic", "--disable-dev-shm-usage"])
            .arg(format!("--remote-debugging-port={devtools}"))
            .arg(format!("--user-data-dir={}", dir.join("chromium").display()))
            .arg(format!("http://127.0.0.1:{port}/"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ws_url = wait_for("Chromium's page target", Duration::from_secs(30), || {
        let list: Value = serde_json::from_str(&get(devtools, "/json/list")?).ok()?;
        list.as_array()?
            .iter()
            .find(|t| t["type"] == "page" && t["url"].as_str().is_some_and(|u| u.contains(&port.to_string())))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str().map(String::from))
    });
    let (ws, _) = tungstenite::client::connect(ws_url).unwrap();
    let page = Page {
        ws: match ws.into_inner() {
            tungstenite::stream::MaybeTlsStream::Plain(s) => {
                tungstenite::WebSocket::from_raw_socket(s, tungstenite::protocol::Role::Client, None)
            }
            _ => unreachable!("a plain loopback connection"),
        },
        next: 0,
    };

    (browser, page)
}

const ROWS: &str = "JSON.stringify([...document.querySelectorAll('tr.election')].map(r => \
    [r.dataset.election, r.querySelector('td:nth-child(2)').textContent, r.querySelector('td:nth-child(3)').textContent]))";

#[test]
fn the_dashboard_shows_a_change_of_leader_live() {
    let Some(chromium) = servers::find_program("chromium") else {
        servers::skip("chromium is not installed (Debian package chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut alpha = leader(dir.path(), "jobs/report", "alpha");
    let _beta = leader(dir.path(), "jobs/sweeper", "beta");
    let (dash, port) = dashboard(dir.path());
    wait_for("the dashboard", Duration::from_secs(20), || get(port, "/api/elections").filter(|b| b.contains("beta")));
    let page = get(port, "/").unwrap();
    assert!(!page.contains("http://") && !page.contains("https://"), "the page loads nothing from elsewhere");

    let (_browser, mut page) = open_page(&chromium, dir.path(), port);

    let rows = |page: &mut Page| -> Vec<Vec<String>> {
        serde_json::from_str(page.eval(ROWS).as_str().unwrap_or("[]")).unwrap_or_default()
    };
    let alpha_token: u64 = wait_for("both elections on the page", Duration::from_secs(20), || {
        let r = rows(&mut page);
        (r.len() == 2 && name_of(&r[0][1]) == "alpha" && name_of(&r[1][1]) == "beta").then(|| r[0][2].parse().unwrap())
    });
    let status = page.eval("document.getElementById('status').textContent");
    assert!(status.as_str().unwrap().starts_with("live"), "{status}");

    // The leader of jobs/report stops; another takes over. The open page follows.
    let pid = rustix::process::Pid::from_raw(alpha.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    alpha.wait().unwrap();
    let mut gamma = leader(dir.path(), "jobs/report", "gamma");
    let t0 = Instant::now();
    let gamma_token = loop {
        let r = rows(&mut page);
        if r.len() == 2
            && name_of(&r[0][1]) == "gamma"
            && let Some(t) = r[0][2].parse::<u64>().ok().filter(|t| *t > alpha_token)
        {
            break t;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            // What the page, the server and the candidate each say, to tell which lagged.
            let status = page.eval("document.getElementById('status').textContent");
            panic!(
                "waited 20s for the page to show gamma leading; the page shows {r:?} ({status}); \
                 the server answers {:?}; gamma {:?}",
                get(port, "/api/elections"),
                gamma.try_wait().map(|s| s.map_or("is running".to_string(), |s| format!("exited: {s}")))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Clicking the election shows its metadata and the changes seen since the page opened.
    page.eval("document.querySelector('tr[data-election=\"jobs/report\"]').click()");
    let detail = wait_for("the detail", Duration::from_secs(5), || {
        let v = page.eval(
            "JSON.stringify({meta: document.getElementById('detail-meta').textContent, \
             changes: [...document.querySelectorAll('#detail-history li')].map(li => li.textContent)})",
        );
        let v: Value = serde_json::from_str(v.as_str()?).ok()?;
        (v["meta"] == "gamma.example:8080").then_some(v)
    });
    let changes: Vec<String> = serde_json::from_value(detail["changes"].clone()).unwrap();
    let shows = |c: &String, name: &str, token: u64| {
        c.contains(&format!(": {name}.")) && c.ends_with(&format!(" (token {token})"))
    };
    // alpha's first term, and the one the page showed (a renewal that found no answer in
    // time on a busy machine can end a term, and alpha is then elected again).
    assert!(changes.first().is_some_and(|c| c.contains(": alpha.")), "{changes:?}");
    assert!(changes.iter().any(|c| shows(c, "alpha", alpha_token)), "{changes:?}");
    assert!(changes.last().is_some_and(|c| shows(c, "gamma", gamma_token)), "{changes:?}");

    // A screenshot of the page as it stands (docs/dashboard.png comes from this).
    let shot = page.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64_decode(shot["data"].as_str().unwrap());
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Ok(to) = std::env::var("TENURE_DASHBOARD_SCREENSHOT") {
        std::fs::write(to, &png).unwrap();
    }

    // A server that stops answering (stopped here; a half-open connection looks the same
    // to the page) is shown as down, not left looking live; the page reconnects once it
    // answers again.
    let status =
        |page: &mut Page| page.eval("document.getElementById('status').textContent").as_str().map(String::from);
    let dash_pid = rustix::process::Pid::from_raw(dash.id() as i32).unwrap();
    rustix::process::kill_process(dash_pid, rustix::process::Signal::STOP).unwrap();
    let down = wait_for("the page to say the server is silent", Duration::from_secs(15), || {
        status(&mut page).filter(|s| s.contains("no word from the server"))
    });
    rustix::process::kill_process(dash_pid, rustix::process::Signal::CONT).unwrap();
    assert!(
        rows(&mut page).first().is_some_and(|r| name_of(&r[1]) == "gamma"),
        "the last snapshot stays shown ({down})"
    );
    wait_for("the page to be live again", Duration::from_secs(15), || {
        status(&mut page).filter(|s| s.starts_with("live"))
    });
}

/// Standard base64, as DevTools sends images.
fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = s.bytes().filter(|c| *c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let v: Vec<u32> = chunk.iter().map(|c| u32::from(value(*c))).collect();
        let n = v.iter().fold(0u32, |acc, x| acc << 6 | x) << (6 * (4 - v.len()));
        out.extend_from_slice(&n.to_be_bytes()[1..][..v.len() - 1]);
    }
    out
}

#[test]
fn a_killed_leader_shows_as_not_renewing_before_its_lease_runs_out_and_history_outlives_a_reload() {
    let Some(chromium) = servers::find_program("chromium") else {
        servers::skip("chromium is not installed (Debian package chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // TTL 8 s: renewals every third of it; after a SIGKILL the lease holds 8 s more.
    let mut alpha = Proc(
        Command::new(tenure())
            .env("TENURE_STORE", format!("sqlite:{}", dir.path().join("s.db").display()))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .args(["run", "jobs/report", "--id", "alpha", "--ttl", "8s", "--announce", "--", "sleep", "600"])
            .spawn()
            .unwrap(),
    );
    let (_dash, port) = dashboard(dir.path());
    wait_for("the dashboard", Duration::from_secs(20), || get(port, "/api/elections").filter(|b| b.contains("alpha")));
    let (_browser, mut page) = open_page(&chromium, dir.path(), port);
    const ROW: &str = "JSON.stringify([...document.querySelectorAll('tr[data-election=\"jobs/report\"] td')].map(td => td.textContent))";
    let row = |page: &mut Page| -> Vec<String> {
        serde_json::from_str(page.eval(ROW).as_str().unwrap_or("[]")).unwrap_or_default()
    };
    // election, leader, token, leading for, candidates, expires in, timeline.
    wait_for("alpha leading, renewing, one candidate", Duration::from_secs(20), || {
        let r = row(&mut page);
        (r.len() == 7 && name_of(&r[1]) == "alpha" && !r[1].contains("not renewing") && r[4] == "1").then_some(())
    });
    alpha.kill().unwrap();
    alpha.wait().unwrap();
    let killed = Instant::now();
    let shown = wait_for("the page to show alpha as not renewing", Duration::from_secs(8), || {
        let r = row(&mut page);
        (r.len() == 7 && r[1].contains("not renewing")).then_some(r)
    });
    let left: f64 = shown[5].trim_end_matches(" s").parse().unwrap();
    assert!(
        left > 0.5,
        "shown as not renewing {:?} after the kill, with {left} s of its lease left: {shown:?}",
        killed.elapsed()
    );
    // The history is the server's: a reload keeps it.
    page.eval("location.reload()");
    let history = wait_for("the reloaded page's history", Duration::from_secs(20), || {
        let v = page.eval("JSON.stringify((elections.get('jobs/report') || {history: []}).history)");
        let h: Vec<Value> = serde_json::from_str(v.as_str()?).ok()?;
        (!h.is_empty()).then_some(h)
    });
    assert!(history.iter().any(|h| h["holder"].as_str().is_some_and(|n| name_of(n) == "alpha")), "{history:?}");
}

#[test]
fn a_huge_record_is_cut_short_for_the_page_and_costs_open_pages_no_copy_each() {
    // 20 MB of metadata (written into the row by hand, as a hostile neighbour with the
    // database could) and 40 live views asked for that read nothing (32 are served).
    let dir = tempfile::tempdir().unwrap();
    let _alpha = leader(dir.path(), "jobs/huge", "alpha");
    let (dash, port) = dashboard(dir.path());
    wait_for("the dashboard", Duration::from_secs(20), || get(port, "/api/elections").filter(|b| b.contains("alpha")));
    let db = rusqlite::Connection::open(dir.path().join("s.db")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    const HUGE: usize = 20_000_000;
    db.execute("UPDATE tenure_leases SET metadata = ?1 WHERE election = 'jobs/huge'", [vec![b'x'; HUGE]]).unwrap();
    let body = wait_for("the huge record on the page", Duration::from_secs(20), || {
        get(port, "/api/elections").filter(|b| b.contains("metadata_bytes"))
    });
    let v: Value = serde_json::from_str(&body).unwrap();
    let l = &v["elections"][0]["leader"];
    assert_eq!(l["metadata_bytes"], json!(HUGE), "{l}");
    let shown = l["metadata"].as_str().unwrap();
    assert!(shown.len() <= 4096 + 3 && shown.starts_with("xxxx"), "{} bytes shown", shown.len());
    let views: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            write!(s, "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let rss_kb = common::rss_kb(dash.id());
    drop(views);
    // Each read of the store holds the record once or twice (20-40 MB); a copy per view
    // would be 800 MB and more.
    assert!(rss_kb < 300_000, "the dashboard holds {rss_kb} kB with 40 live views of a 20 MB record");
}
