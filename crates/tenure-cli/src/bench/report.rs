//! The table `tenure bench` prints without `--json`.

use serde_json::Value;

use super::secs;

/// Prints the run's figures as a table.
pub(super) fn print_table(v: &Value) {
    println!("store      {}", v["store"].as_str().unwrap_or(""));
    println!("ttl        {}", fmt_d(secs(v, "ttl_s")));
    let lat = |label: &str, k: &str, extra: &str| {
        if let Some(x) = v.get(k) {
            let ratio = x.get(extra).and_then(Value::as_f64).map_or(String::new(), |r| {
                format!("   p50 = {r:.1} × {}", if extra == "p50_in_ttl" { "TTL" } else { "round trip" })
            });
            lat_of(label, x, &ratio);
        }
    };
    lat("round trip (get)", "rtt", "");
    lat("uncontended acquire", "acquire", "p50_in_rtt");
    lat("graceful handover", "handover", "p50_in_rtt");
    if let Some(steps) = v.get("handover").and_then(|h| h.get("steps")) {
        for (k, label) in super::latency::STEPS.iter().zip([
            "  until release sent",
            "  release",
            "  release sent → heard",
            "  heard → acquire sent",
            "  acquire",
            "  until Elected seen",
        ]) {
            lat_of(label, &steps[*k], "");
        }
    }
    lat("crash takeover", "crash", "p50_in_ttl");
    if let Some(l) = v.get("load") {
        let w = &l["watching"];
        println!(
            "steady load            {} elections × {} candidates for {}",
            w["elections"],
            w["candidates"],
            fmt_d(secs(w, "seconds"))
        );
        println!("  {:<28} {:>12} {:>12}", "", "watching", "polling");
        let p = &l["polling_baseline"];
        for (label, k) in [
            ("store calls/s, all", "calls_per_s"),
            ("calls/s per leader", "calls_per_s_per_leader"),
            ("calls/s per follower", "calls_per_s_per_follower"),
            ("watch events/s per follower", "watch_reads_per_s_per_follower"),
        ] {
            println!("  {label:<28} {:>12.2} {:>12.2}", secs(w, k), secs(p, k));
        }
    }
    if let Some(r) = v.get("run") {
        lat_of("tenure run handover", &r["tenure_run"], "");
        if let Some(x) = r.get("etcdctl_lock") {
            lat_of("etcdctl lock handover", x, "");
        }
    }
    if let Some(x) = v.get("etcdctl") {
        println!(
            "etcdctl elect baseline handover {}   crash takeover {}",
            fmt_d(secs(x, "handover_s")),
            fmt_d(secs(x, "crash_takeover_s"))
        );
    }
    if let Some(c) = v.get("contest") {
        println!(
            "contest                {} elections, each contested by {} processes, for {}",
            c["elections"],
            c["processes"],
            fmt_d(secs(c, "seconds"))
        );
        println!(
            "  leading (all processes) {} when measured, {} at the end; terms lost {}; leaders changed {}",
            c["leading_when_measured"], c["still_leading"], c["terms_lost"], c["leaders_changed"]
        );
        println!(
            "  store calls/s (all processes) {:.1}; renewal p99 (worst process) {}; CPU µs/s per election {:.2}",
            secs(c, "store_calls_per_s"),
            fmt_d(secs(c, "renewal_p99_max")),
            secs(c, "cpu_s_per_election_per_s") * 1e6
        );
    }
    if let Some(sc) = v.get("scale") {
        println!(
            "scale                  {} elections in one process for {}",
            sc["batched"]["elections"],
            fmt_d(secs(&sc["batched"], "seconds"))
        );
        println!("  {:<28} {:>12} {:>12}", "", "batched", "per election");
        let (b, p) = (&sc["batched"], &sc["per_election_baseline"]);
        // Without the baseline (scenario scale-batched), its column says so.
        let baseline = |f: &dyn Fn(&Value) -> String| if p.is_null() { "–".to_string() } else { f(p) };
        let row =
            |label: &str, f: &dyn Fn(&Value) -> String| println!("  {label:<28} {:>12} {:>12}", f(b), baseline(f));
        row("all won in", &|x| fmt_d(secs(x, "all_won_in_s")));
        row("renewals", &|x| x["renewals"].to_string());
        row("store calls/s", &|x| format!("{:.1}", secs(x, "store_calls_per_s")));
        row("renewal p99", &|x| fmt_d(secs(&x["renewal_latency"], "p99")));
        row("terms lost", &|x| x["terms_lost"].to_string());
        row("CPU µs/s per election", &|x| format!("{:.2}", secs(x, "cpu_s_per_election_per_s") * 1e6));
        row("RSS bytes per election", &|x| format!("{:.0}", secs(x, "rss_bytes_per_election")));
        row("all released in", &|x| fmt_d(secs(x, "all_released_in_s")));
        row("left unreleased", &|x| x["left_unreleased"].to_string());
    }
}

/// One row of latency figures, with `extra` after them.
fn lat_of(label: &str, x: &Value, extra: &str) {
    println!(
        "{label:<22} p50 {:>10}  p90 {:>10}  p99 {:>10}  max {:>10}  (n={}){extra}",
        fmt_d(secs(x, "p50")),
        fmt_d(secs(x, "p90")),
        fmt_d(secs(x, "p99")),
        fmt_d(secs(x, "max")),
        x["n"]
    );
}

fn fmt_d(s: f64) -> String {
    if s < 0.001 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}
