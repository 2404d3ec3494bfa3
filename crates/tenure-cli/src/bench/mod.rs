//! `tenure bench`: speed and load of the runtime on one store, measured in one run, with
//! the store's own round trip and a polling baseline as references.
//!
//! - this module: the settings, the run and its helpers;
//! - [`latency`]: round trip, acquire, handover and crash takeover;
//! - [`load`]: store calls in steady state, watching and polling;
//! - [`scale`]: many elections in one process, and contested by several;
//! - [`etcdctl`]: `etcdctl elect` as a baseline on the same etcd;
//! - [`process`]: `tenure run` handing a command over, and `etcdctl lock` on etcd;
//! - [`report`]: the table printed without `--json`.
//!
//! Every candidate's store calls go through [`tenure::faults::FaultyStore`], which counts
//! them and cuts a candidate off for the crash scenario.

mod etcdctl;
mod latency;
mod load;
mod process;
mod report;
mod scale;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tenure::{ElectionName, LeaseStore};

pub use scale::contest_peer;

/// What `tenure bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    /// The store's raw round trip: a `get` of an election nobody holds
    Rtt,
    /// Uncontended acquire latency
    Acquire,
    /// A leader resigns; time until the other candidate leads
    Handover,
    /// A leader stops without releasing; time until the other candidate leads
    Crash,
    /// Store operations in steady state, with watches and with polling (the baseline)
    Load,
    /// Many elections held by one process: renewal latency, missed renewals, CPU, memory
    Scale,
    /// The scale scenario through `Batched` alone, without its per-election baseline: the
    /// process's peak memory (`/usr/bin/time -f %M`) is then that of `Batched`
    ScaleBatched,
    /// The scale elections, each contested by several processes (--processes)
    Contest,
    /// etcd only: handover and crash takeover of the Debian `etcdctl elect`, as a baseline
    Etcdctl,
    /// `tenure run` processes: one's command exits, time until the next one's starts
    /// (--samples, at most 20); on etcd, `etcdctl lock` with the same commands
    Run,
}

/// Settings of a run: the arguments of `tenure bench`.
#[derive(clap::Args)]
pub struct Settings {
    /// Scenarios to run (default: all but scale and contest)
    #[arg(long = "scenario", value_name = "SCENARIO", value_enum, value_delimiter = ',', default_values_t = [Scenario::Rtt, Scenario::Acquire, Scenario::Handover, Scenario::Crash, Scenario::Load])]
    pub scenarios: Vec<Scenario>,
    /// Lease TTL of every candidate
    #[arg(long, default_value = "2s", value_parser = crate::args::duration)]
    pub ttl: Duration,
    /// Samples for round trip and acquire (crash takes at most 5, run at most 20)
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Graceful handovers in the handover scenario, each twice the resigner's back-off
    /// after the last (0.8 s at TTL 2 s); of 50 the p99 is the slowest, of 200 the third
    /// slowest
    #[arg(long, default_value_t = 50)]
    pub handovers: usize,
    /// Elections in the load scenario
    #[arg(long, default_value_t = 10)]
    pub elections: usize,
    /// Candidates per election in the load scenario (one store handle each)
    #[arg(long, default_value_t = 3)]
    pub candidates: usize,
    /// How long the load, scale and contest scenarios measure
    #[arg(long, default_value = "10s", value_parser = crate::args::duration)]
    pub duration: Duration,
    /// Elections held by one process in the scale scenario (and contested in contest)
    #[arg(long, default_value_t = 10_000)]
    pub scale: usize,
    /// Processes contesting every election in the contest scenario
    #[arg(long, default_value_t = 3)]
    pub processes: usize,
    /// Internal: be one of the contest's other processes, for this run
    #[arg(long, hide = true)]
    pub contest_peer: Option<String>,
    /// The `--store` given to this process, passed on to the contest's other processes.
    #[arg(skip)]
    pub store_url: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Opens a new handle on the store under test (each candidate process has its own).
pub struct Opener<'a>(Box<dyn Fn() -> Opening<'a> + 'a>);

/// A store handle being opened.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn LeaseStore>>> + 'a>>;

impl<'a> Opener<'a> {
    /// Opens with `open`.
    pub fn new<F, Fut>(open: F) -> Self
    where
        F: Fn() -> Fut + 'a,
        Fut: Future<Output = Result<Arc<dyn LeaseStore>>> + 'a,
    {
        Self(Box::new(move || Box::pin(open())))
    }

    async fn open(&self) -> Result<Arc<dyn LeaseStore>> {
        (self.0)().await
    }
}

/// Runs the scenarios against `open()`'s store and prints the figures.
pub async fn bench(open: Opener<'_>, s: &Settings) -> Result<i32> {
    if s.samples == 0
        || s.handovers == 0
        || s.candidates < 2
        || s.elections == 0
        || s.scale == 0
        || s.duration.is_zero()
    {
        bail!(
            "--samples, --handovers, --elections, --scale and --duration must be above 0 and --candidates at least 2"
        );
    }
    let run = format!("{:x}", fastrand::u32(..));
    let first = open.open().await?;
    let mut out = serde_json::Map::new();
    out.insert("store".into(), json!(first.describe()));
    out.insert("ttl_s".into(), json!(s.ttl.as_secs_f64()));
    let mut rtt_p50 = None;
    let mut scenarios = s.scenarios.clone();
    scenarios.sort();
    scenarios.dedup();
    for sc in scenarios {
        if !s.json {
            eprintln!("bench: {sc:?} …");
        }
        let v = match sc {
            Scenario::Rtt => {
                let v = latency::rtt(&*first, s.samples, &run).await?;
                rtt_p50 = Some(secs(&v, "p50"));
                v
            }
            Scenario::Acquire => latency::acquire(&*first, s, &run).await?,
            Scenario::Handover => latency::handover(&open, s, &run).await?,
            Scenario::Crash => latency::crash(&open, s, &run).await?,
            Scenario::Load => {
                let watching = load::load(&open, s, &run, false).await?;
                let polling = load::load(&open, s, &run, true).await?;
                json!({"watching": watching, "polling_baseline": polling})
            }
            Scenario::Etcdctl => etcdctl::etcdctl(&first.describe(), &run).await?,
            Scenario::Run => process::run(&first.describe(), s, &run).await?,
            Scenario::Contest => scale::contest(&open, s, &run).await?,
            Scenario::Scale => {
                let batched = scale::scale(&open, s, &run, true).await?;
                let baseline = scale::scale(&open, s, &run, false).await?;
                json!({"batched": batched, "per_election_baseline": baseline})
            }
            Scenario::ScaleBatched => json!({"batched": scale::scale(&open, s, &run, true).await?}),
        };
        let key =
            if matches!(sc, Scenario::ScaleBatched) { "scale".to_string() } else { format!("{sc:?}").to_lowercase() };
        out.insert(key, v);
    }
    if let Some(r) = rtt_p50.filter(|r| *r > 0.0) {
        for k in ["acquire", "handover"] {
            if let Some(Value::Object(m)) = out.get_mut(k) {
                let p50 = m["p50"].as_f64().unwrap_or(0.0);
                m.insert("p50_in_rtt".into(), json!(p50 / r));
            }
        }
    }
    let out = Value::Object(out);
    if s.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        report::print_table(&out);
    }
    Ok(0)
}

/// Latency figures of a sample, in seconds.
pub(crate) fn stats(mut v: Vec<Duration>) -> Value {
    v.sort();
    let at = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).map_or(0.0, |d| d.as_secs_f64());
    json!({"n": v.len(), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)})
}

pub(crate) fn secs(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

pub(crate) fn name(s: &str) -> Result<ElectionName> {
    ElectionName::new(s).context("bench election name")
}
