#!/usr/bin/env python3
"""Draws docs/benchmarks/takeover.svg from the JSON reports next to it, and prints the
figures as Markdown tables (for docs/benchmarks/archive.md, and the current figures in docs/benchmarks.md)."""
import json
import pathlib

here = pathlib.Path(__file__).parent
stores = ["sqlite", "postgres", "mariadb", "redis", "etcd", "nats"]
runs = {s: json.loads((here / f"{s}.json").read_text()) for s in stores if (here / f"{s}.json").exists()}


def ms(x):
    return f"{x * 1000:.2f} ms" if x < 1 else f"{x:.2f} s"


# Bars: crash takeover and graceful handover per store, and the etcdctl elect baseline.
bars = []
for s, r in runs.items():
    bars.append((f"tenure · {s}", r["crash"]["p50"], r["crash"]["p99"], r["handover"]["p50"]))
if "etcd" in runs and "etcdctl" in runs["etcd"]:
    e = runs["etcd"]["etcdctl"]
    bars.append(("etcdctl elect (etcd 3.4)", e["crash_takeover_s"], e["crash_takeover_s"], e["handover_s"]))

width, left, row = 760, 200, 34
top = 50
height = top + row * len(bars) + 50
longest = max(b[2] for b in bars) if bars else 1
scale = (width - left - 90) / longest
svg = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="13">',
    f'<rect width="{width}" height="{height}" fill="white"/>',
    f'<text x="{left}" y="22" font-size="15" font-weight="bold">Crash takeover (p50, bar; p99, line) and graceful handover (p50, text)</text>',
    f'<text x="{left}" y="40" fill="#555">TTL 2 s for tenure; etcdctl elect uses its fixed 60 s session TTL. Seconds, linear scale.</text>',
]
for i, (label, p50, p99, hand) in enumerate(bars):
    y = top + i * row
    colour = "#c0392b" if label.startswith("etcdctl") else "#2e86c1"
    svg.append(f'<text x="{left - 8}" y="{y + 18}" text-anchor="end">{label}</text>')
    svg.append(f'<rect x="{left}" y="{y + 5}" width="{max(p50 * scale, 1):.1f}" height="18" fill="{colour}"/>')
    svg.append(f'<line x1="{left + p99 * scale:.1f}" y1="{y + 2}" x2="{left + p99 * scale:.1f}" y2="{y + 26}" stroke="black" stroke-width="2"/>')
    svg.append(f'<text x="{left + p99 * scale + 6:.1f}" y="{y + 18}">{ms(p50)} · handover {ms(hand)}</text>')
axis_y = top + row * len(bars) + 8
svg.append(f'<line x1="{left}" y1="{axis_y}" x2="{width - 90}" y2="{axis_y}" stroke="#333"/>')
step = 10 if longest > 20 else 1
t = 0
while t <= longest:
    x = left + t * scale
    svg.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#333"/>')
    svg.append(f'<text x="{x:.1f}" y="{axis_y + 20}" text-anchor="middle">{t} s</text>')
    t += step
svg.append("</svg>")
(here / "takeover.svg").write_text("\n".join(svg) + "\n")

print("| store | round trip p50 | acquire p50 (× RTT) | handover p50 / p99 (× RTT) | crash takeover p50 / p99 (× TTL) |")
print("|---|---|---|---|---|")
for s, r in runs.items():
    rt, a, h, c = r["rtt"], r["acquire"], r["handover"], r["crash"]
    print(f"| {s} | {ms(rt['p50'])} | {ms(a['p50'])} ({a.get('p50_in_rtt', 0):.1f}) | {ms(h['p50'])} / {ms(h['p99'])} ({h.get('p50_in_rtt', 0):.0f}) "
          f"| {ms(c['p50'])} / {ms(c['p99'])} ({c['p50'] / r['ttl_s']:.2f} / {c['p99'] / r['ttl_s']:.2f}) |")
print()
print("| store | calls/s all (watch / poll) | per leader (watch / poll) | per follower (watch / poll) | watch events/s per follower |")
print("|---|---|---|---|---|")
for s, r in runs.items():
    w, p = r["load"]["watching"], r["load"]["polling_baseline"]
    print(f"| {s} | {w['calls_per_s']:.1f} / {p['calls_per_s']:.1f} | {w['calls_per_s_per_leader']:.2f} / {p['calls_per_s_per_leader']:.2f} "
          f"| {w['calls_per_s_per_follower']:.2f} / {p['calls_per_s_per_follower']:.2f} | {w['watch_reads_per_s_per_follower']:.2f} |")
print()
print("| store | `tenure run` handover p50 / p99 (n) | `etcdctl lock` handover, same commands, p50 / p99 (n) | `etcdctl elect` handover |")
print("|---|---|---|---|")
for s, r in runs.items():
    if "run" not in r:
        continue
    t, lock, elect = r["run"]["tenure_run"], r["run"].get("etcdctl_lock"), r.get("etcdctl")
    lock = f"{ms(lock['p50'])} / {ms(lock['p99'])} ({lock['n']})" if lock else "–"
    elect = ms(elect["handover_s"]) if elect else "–"
    print(f"| {s} | {ms(t['p50'])} / {ms(t['p99'])} ({t['n']}) | {lock} | {elect} |")
print()
print("| store | mode | elections won (time) | store calls/s | renewal p99 | terms lost while measuring (why) | CPU µs/s per election | RSS per election |")
print("|---|---|---|---|---|---|---|---|")
for s, r in runs.items():
    if not r.get("scale"):
        continue
    for mode, key in (("batched", "batched"), ("one call per renewal", "per_election_baseline")):
        x = r["scale"][key]
        won = (f"all {x['elections']} ({ms(x['all_won_in_s'])})" if x.get("all_won", True)
               else f"gave up: {x['leading_when_measured']} leading of {x['started']} started after {ms(x['all_won_in_s'])}")
        # The second run reuses memory the first one freed: only the first run's growth counts.
        rss = f"{x['rss_bytes_per_election'] / 1024:.1f} KiB" if key == "batched" else "(not comparable)"
        why = ", ".join(f"{k} {v}" for k, v in x.get("terms_lost_by_reason", {}).items())
        print(f"| {s} | {mode} | {won} | {x['store_calls_per_s']:.1f} | {ms(x['renewal_latency']['p99'])} "
              f"| {x['terms_lost']}{f' ({why})' if why else ''} | {x['cpu_s_per_election_per_s'] * 1e6:.1f} | {rss} |")

# The scale-only runs (`run.sh --scale`): scale-STORE.json, with the contest scenario.
scale_runs = {s: json.loads((here / f"scale-{s}.json").read_text()) for s in stores
              if (here / f"scale-{s}.json").exists() and (here / f"scale-{s}.json").stat().st_size}
if scale_runs:
    print()
    print("| store | mode | elections won (time) | store calls/s | renewal p99 | terms lost while measuring | lost while starting | CPU µs/s per election | RSS per election |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s, r in scale_runs.items():
        for mode, key in (("batched", "batched"), ("one call per renewal", "per_election_baseline")):
            x = r["scale"][key]
            won = (f"all {x['elections']} ({ms(x['all_won_in_s'])})" if x.get("all_won", True)
                   else f"gave up: {x['leading_when_measured']} leading of {x['started']} started after {ms(x['all_won_in_s'])}")
            rss = f"{x['rss_bytes_per_election'] / 1024:.1f} KiB" if key == "batched" else "(not comparable)"
            p99 = ms(x['renewal_latency']['p99']) if x['renewal_latency']['n'] else "–"
            print(f"| {s} | {mode} | {won} | {x['store_calls_per_s']:.1f} | {p99} | {x['terms_lost']} "
                  f"| {x['terms_lost_while_starting']} | {x['cpu_s_per_election_per_s'] * 1e6:.1f} | {rss} |")
    print()
    print("| store | leading when measured / at the end (per process) | terms lost | leaders changed | store calls/s, all processes | renewal p99, worst process | CPU µs/s per election, all processes |")
    print("|---|---|---|---|---|---|---|")
    for s, r in scale_runs.items():
        c = r.get("contest")
        if not c:
            print(f"| {s} | did not finish | | | | | |")
            continue
        per = " + ".join(str(p["leading_when_measured"]) for p in c["per_process"])
        print(f"| {s} | {c['leading_when_measured']} / {c['still_leading']} ({per}) | {c['terms_lost']} | {c['leaders_changed']} "
              f"| {c['store_calls_per_s']:.1f} | {ms(c['renewal_p99_max'])} | {c['cpu_s_per_election_per_s'] * 1e6:.1f} |")
