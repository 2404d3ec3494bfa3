#!/usr/bin/env python3
"""Requests a ZooKeeper server receives from one leader and two idle followers.

Starts a throwaway ZooKeeper (`tenure-serve zookeeper`), then, one after the other:

- three `tenure run` processes on one election (`--ttl` the session timeout), and
- as the baseline, three processes holding kazoo's `Lock` recipe on one path (kazoo from
  PyPI, session timeout the same): the holder sleeps, the others wait on their watch.

For each, after a warm-up, the server's own count of packets received (`srvr`, less the
`srvr` requests themselves) over `--seconds`, per second. The processes of one side are
stopped before the other side starts.

    python3 docs/benchmarks/zk-traffic.py --tenure target/release/tenure \\
        --serve target/release/tenure-serve [--ttl 4] [--seconds 30]
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

KAZOO_HOLDER = r"""
import sys, time
from kazoo.client import KazooClient
zk = KazooClient(hosts=sys.argv[1], timeout=float(sys.argv[2]))
zk.start()
lock = zk.Lock("/kazoo-traffic/lock", sys.argv[3])
with lock:
    print("holding", flush=True)
    while True:
        time.sleep(3600)
"""


def four_letters(port, word):
    """The server's answer to a four-letter command."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(word)
        text = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            text += chunk
    return text


def received(port):
    """The server's count of packets received so far (one more for this request)."""
    text = four_letters(port, b"srvr")
    m = re.search(rb"Received: (\d+)", text)
    if not m:
        sys.exit(f"srvr gave no packet count: {text!r}")
    return int(m.group(1))


def sessions(port):
    """Packets received so far on each client connection, by session id, with its
    session timeout in ms (the server's `cons`)."""
    out = {}
    for m in re.finditer(rb"recved=(\d+).*?sid=(0x[0-9a-f]+).*?to=(\d+)", four_letters(port, b"cons")):
        out[m.group(2).decode()] = (int(m.group(1)), int(m.group(3)))
    return out


def measure(port, procs, warmup, seconds):
    """Packets a second over `seconds`, after `warmup`, with `procs` running; and each
    session's share, as (session timeout in ms, packets a second)."""
    time.sleep(warmup)
    for p in procs:
        if p.poll() is not None:
            sys.exit(f"a process exited early ({p.args!r}: {p.returncode})")
    before, per_before = received(port), sessions(port)
    time.sleep(seconds)
    after, per_after = received(port), sessions(port)
    per = sorted(
        (to, (n - per_before[sid][0]) / seconds) for sid, (n, to) in per_after.items() if sid in per_before
    )
    # The later srvr and the first cons are among the packets counted.
    return (after - before - 2) / seconds, per


def stop(procs):
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tenure", required=True)
    ap.add_argument("--serve", required=True, help="the tenure-serve binary")
    ap.add_argument("--ttl", type=float, default=4.0, help="TTL and session timeout, seconds")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--skip-kazoo", action="store_true")
    a = ap.parse_args()

    serve = subprocess.Popen([a.serve, "zookeeper"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url = serve.stdout.readline().strip()
    if not url:
        sys.exit("tenure-serve printed no URL")
    port = int(re.search(r":(\d+)", url).group(1))
    hosts = f"127.0.0.1:{port}"
    out = {}
    try:
        with tempfile.TemporaryDirectory() as state:
            env = dict(os.environ, XDG_STATE_HOME=state)
            ttl = f"{int(a.ttl * 1000)}ms"
            procs = [
                subprocess.Popen(
                    [a.tenure, "--store", url, "run", "zk-traffic", "--ttl", ttl, "--id", f"c{i}", "--", "sleep", "1000000"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                )
                for i in range(3)
            ]
            try:
                out["tenure run"] = measure(port, procs, a.warmup, a.seconds)
            finally:
                stop(procs)
        if not a.skip_kazoo:
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", KAZOO_HOLDER, hosts, str(a.ttl), f"k{i}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                )
                for i in range(3)
            ]
            try:
                out["kazoo Lock"] = measure(port, procs, a.warmup, a.seconds)
            finally:
                stop(procs)
    finally:
        serve.stdin.close()
        serve.wait(timeout=30)
    print(f"ZooKeeper, one leader and two followers, session timeout {a.ttl:g} s, {a.seconds:g} s measured:")
    for name, (rate, per) in out.items():
        print(f"  {name:<12} {rate:6.2f} packets/s received by the server")
        for to, r in per:
            print(f"      a session of {to / 1000:g} s: {r:5.2f} packets/s")


if __name__ == "__main__":
    main()
