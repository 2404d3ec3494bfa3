//! `tenure-sim`: runs the deterministic simulation for many seeds and checks every history.
//!
//! ```text
//! cargo run --release -p tenure-lab --bin tenure-sim -- --seeds 10000 --first-seed 1
//! ```
//!
//! Exits 1 on any violation (printing the seed to replay with `--seeds 1 --first-seed S`),
//! or if a replayed seed does not reproduce its event log; 2 on bad arguments.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tenure_lab::sim::{Mutant, SeedReport, SimConfig, run_seed};

struct Args {
    seeds: u64,
    first: u64,
    threads: usize,
    cfg: SimConfig,
    verbose: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 1000,
        first: 1,
        threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cfg: SimConfig::default(),
        verbose: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--seeds" => a.seeds = value()?.parse().map_err(|e| format!("--seeds: {e}"))?,
            "--first-seed" => a.first = value()?.parse().map_err(|e| format!("--first-seed: {e}"))?,
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--duration" => {
                a.cfg.duration = humantime_lite(&value()?).ok_or("--duration takes seconds, e.g. 60s")?;
            }
            "--mutant" => {
                let m = match value()?.as_str() {
                    "zero-margin" => Mutant::ZeroSafetyMargin,
                    "deadline-from-response" => Mutant::DeadlineFromResponse,
                    "renew-without-cas" => Mutant::RenewWithoutCas,
                    "monotonic-deadlines" => Mutant::MonotonicDeadlines,
                    "refusal-is-fatal" => Mutant::RefusalIsFatal,
                    "hand-over-without-stepping-down" => Mutant::HandOverWithoutSteppingDown,
                    "extra-holder" => Mutant::ExtraHolder,
                    other => {
                        return Err(format!(
                            "unknown mutant {other:?}; one of zero-margin, deadline-from-response, renew-without-cas, monotonic-deadlines, refusal-is-fatal, hand-over-without-stepping-down, extra-holder"
                        ));
                    }
                };
                if !m.available() {
                    return Err(format!(
                        "{m:?} is planted in the runtime, which this build lacks; build with \
                         `cargo build -p tenure-lab --features mutants --bin tenure-sim`"
                    ));
                }
                a.cfg.mutant = Some(m);
            }
            "--trace" => {
                a.cfg.trace_calls = true;
                a.cfg.keep_log = true;
            }
            "-v" | "--verbose" => a.verbose = true,
            "--log" => a.cfg.keep_log = true,
            "-h" | "--help" => {
                return Err("usage: tenure-sim [--seeds N] [--first-seed S] [--duration 60s] [--threads T] \
                            [--mutant zero-margin|deadline-from-response|renew-without-cas|monotonic-deadlines|refusal-is-fatal|hand-over-without-stepping-down|extra-holder] [-v] [--log] [--trace]"
                    .into());
            }
            other => return Err(format!("unknown argument {other:?}; see --help")),
        }
    }
    Ok(a)
}

fn humantime_lite(s: &str) -> Option<Duration> {
    let n: u64 = s.strip_suffix('s').unwrap_or(s).parse().ok()?;
    Some(Duration::from_secs(n))
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Duration::from_nanos(sorted[i])
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tenure-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let next = AtomicU64::new(args.first);
    let end = args.first + args.seeds;
    let reports: Mutex<Vec<SeedReport>> = Mutex::new(Vec::new());
    let replay_failures: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..args.threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= end {
                        return;
                    }
                    let r = run_seed(seed, &args.cfg);
                    // Every 100th seed runs twice: the event logs must be identical.
                    if seed.is_multiple_of(100) {
                        let cfg = SimConfig { keep_log: true, ..args.cfg.clone() };
                        let (a, b) = (run_seed(seed, &cfg), run_seed(seed, &cfg));
                        if a.log_hash != r.log_hash || b.log_hash != r.log_hash {
                            let i = a.log.iter().zip(&b.log).position(|(x, y)| x != y).unwrap_or(0);
                            eprintln!(
                                "seed {seed} did not replay exactly; first difference at event {i}:\n  {}\n  {}",
                                a.log.get(i).map(String::as_str).unwrap_or("-"),
                                b.log.get(i).map(String::as_str).unwrap_or("-")
                            );
                            replay_failures.lock().unwrap().push(seed);
                        }
                    }
                    for line in &r.log {
                        println!("{line}");
                    }
                    if args.verbose || !r.summary.violations.is_empty() {
                        eprintln!(
                            "seed {seed}: {} terms, {} faults, {} violations",
                            r.summary.terms,
                            r.faults,
                            r.summary.violations.len()
                        );
                    }
                    reports.lock().unwrap().push(r);
                }
            });
        }
    });
    let reports = reports.into_inner().unwrap();
    let replay_failures = replay_failures.into_inner().unwrap();
    let simulated: Duration = reports.iter().map(|r| r.simulated).sum();
    let faults: u64 = reports.iter().map(|r| r.faults).sum();
    let terms: usize = reports.iter().map(|r| r.summary.terms).sum();
    let stale: usize = reports.iter().map(|r| r.summary.stale_writes_rejected).sum();
    let writes: usize = reports.iter().map(|r| r.summary.writes_accepted).sum();
    let mut takeovers: Vec<u64> = reports.iter().flat_map(|r| r.summary.takeovers_after_crash.clone()).collect();
    takeovers.sort();
    let mut handovers: Vec<u64> = reports.iter().flat_map(|r| r.summary.handovers_after_stop.clone()).collect();
    handovers.sort();
    let mut bad: Vec<&SeedReport> = reports.iter().filter(|r| !r.summary.violations.is_empty()).collect();
    bad.sort_by_key(|r| r.seed);
    let violations: usize = bad.iter().map(|r| r.summary.violations.len()).sum();

    println!("seeds               {} ({}..{})", reports.len(), args.first, end - 1);
    if let Some(m) = args.cfg.mutant {
        println!("mutant              {m:?}");
    }
    println!("simulated time      {:.1} h", simulated.as_secs_f64() / 3600.0);
    println!("faults injected     {faults}");
    println!("leadership terms    {terms}");
    println!("writes accepted     {writes}");
    println!("stale writes        {stale} rejected by the fence");
    println!(
        "crash takeover      p50 {:?}  p99 {:?}  max {:?}  ({} crashes on calm seeds)",
        percentile(&takeovers, 0.5),
        percentile(&takeovers, 0.99),
        percentile(&takeovers, 1.0),
        takeovers.len()
    );
    println!(
        "graceful handover   p50 {:?}  p99 {:?}  max {:?}  ({} stops)",
        percentile(&handovers, 0.5),
        percentile(&handovers, 0.99),
        percentile(&handovers, 1.0),
        handovers.len()
    );
    println!(
        "replays checked     {} (identical: {})",
        reports.iter().filter(|r| r.seed % 100 == 0).count(),
        replay_failures.is_empty()
    );
    println!("violations          {violations}");
    println!("wall time           {:.1} s", started.elapsed().as_secs_f64());
    for r in bad.iter().take(5) {
        for v in r.summary.violations.iter().take(3) {
            println!("\nseed {}: {v}", r.seed);
        }
        println!("replay: tenure-sim --seeds 1 --first-seed {}", r.seed);
    }
    if !replay_failures.is_empty() {
        println!("seeds whose replay differed: {replay_failures:?}");
    }
    if violations > 0 || !replay_failures.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS }
}
