#!/usr/bin/env python3
"""Gossip elections in a burst and one at a time, beside Celery on the same Redis.

Three `tenure gossip worker` processes and three Celery workers (prefork, ten processes
each, so that a burst of 30 runs at once as tenure's workers run actions side by side) on
one throwaway Redis; every action or task does nothing (`true`, `pass`). A tenure
election counts as done when the initiator prints that the winner started the action; a
Celery task when its (empty) result is in the result backend. For each round:

- tenure, burst from one process: `tenure gossip elect --from-file` with 30 ids; each
  election's time is from the start of the command until its line is printed;
- tenure, burst of processes: 30 `tenure gossip elect ID` started at once; each one's
  time is its process's run;
- tenure, one at a time: 10 `tenure gossip elect ID`, one after another;
- Celery, burst: 30 `delay()` calls at once from one process, each timed until its
  result is in the result backend; Celery, one at a time: 10 `delay().get()`.

Prints the median and the slowest of each, over all rounds.

    python3 docs/benchmarks/gossip-burst.py [--rounds 5] [--tenure target/release/tenure]

Needs redis-server and redis-cli, and celery[redis] in the Python that runs it.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

BURST = 30
SINGLE = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, ok, limit=30.0):
    t0 = time.monotonic()
    while not ok():
        if time.monotonic() - t0 > limit:
            sys.exit(f"waited {limit} s for {what}")
        time.sleep(0.05)


def tenure_rounds(tenure, broker, work, rounds):
    env = dict(os.environ, TENURE_BROKER=broker, RUST_LOG="warn")
    workers = []
    for n in range(3):
        with open(os.path.join(work, f"w{n}.out"), "w") as out:
            workers.append(
                subprocess.Popen(
                    [tenure, "gossip", "worker", "--group", "bench", "--allow-command"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                )
            )

    def joined():
        def text(n):
            with open(os.path.join(work, f"w{n}.out")) as f:
                return f.read()

        return all(text(n).startswith("joined") for n in range(3))

    wait_for("three tenure workers to join", joined)
    elect = [tenure, "gossip", "elect", "--group", "bench", "--action", "true"]
    one_process, processes, single = [], [], []
    try:
        for r in range(rounds):
            ids = os.path.join(work, f"ids-{r}")
            with open(ids, "w") as f:
                f.write("".join(f"f{r}-{i}\n" for i in range(BURST)))
            t0 = time.monotonic()
            p = subprocess.Popen(elect + ["--from-file", ids], env=env, stdout=subprocess.PIPE, text=True)
            for line in p.stdout:
                if " started " in line:
                    one_process.append(time.monotonic() - t0)
            if p.wait() != 0:
                sys.exit(f"tenure gossip elect --from-file exited {p.returncode}")

            t0 = time.monotonic()
            procs = [
                subprocess.Popen(elect + [f"p{r}-{i}"], env=env, stdout=subprocess.DEVNULL) for i in range(BURST)
            ]
            pending = set(range(BURST))
            while pending:
                for i in list(pending):
                    if procs[i].poll() is not None:
                        if procs[i].returncode != 0:
                            sys.exit(f"tenure gossip elect exited {procs[i].returncode}")
                        processes.append(time.monotonic() - t0)
                        pending.discard(i)
                time.sleep(0.0005)

            for i in range(SINGLE):
                t0 = time.monotonic()
                subprocess.run(elect + [f"s{r}-{i}"], env=env, stdout=subprocess.DEVNULL, check=True)
                single.append(time.monotonic() - t0)
    finally:
        for w in workers:
            w.terminate()
            w.wait()
    return one_process, processes, single


CELERY_APP = """
from celery import Celery
app = Celery("bench", broker="{broker}", backend="{broker}")
app.conf.worker_prefetch_multiplier = 1

@app.task
def nothing():
    pass
"""


def celery_rounds(broker, work, rounds):
    with open(os.path.join(work, "benchapp.py"), "w") as f:
        f.write(CELERY_APP.format(broker=broker))
    sys.path.insert(0, work)
    import benchapp  # noqa: E402

    env = dict(os.environ, PYTHONPATH=work)
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchapp", "worker", "-c", "10", "-n", f"w{n}@%h", "-l", "warning"],
            env=env,
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(3)
    ]
    try:
        wait_for("three Celery workers", lambda: len(benchapp.app.control.ping(timeout=0.5) or []) >= 3, 60)
        benchapp.nothing.delay().get(timeout=30)
        burst, single = [], []
        for _ in range(rounds):
            t0 = time.monotonic()
            results = [benchapp.nothing.delay() for _ in range(BURST)]
            pending = set(range(BURST))
            while pending:
                for i in list(pending):
                    if results[i].ready():
                        burst.append(time.monotonic() - t0)
                        pending.discard(i)
                time.sleep(0.002)
            for _ in range(SINGLE):
                t0 = time.monotonic()
                benchapp.nothing.delay().get(timeout=30, interval=0.002)
                single.append(time.monotonic() - t0)
        return burst, single
    finally:
        for w in workers:
            w.terminate()
            w.wait()


def show(name, times):
    ms = sorted(t * 1000 for t in times)
    print(f"{name:<46} n={len(ms):<4} median {statistics.median(ms):7.1f} ms   slowest {ms[-1]:7.1f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tenure", default="target/release/tenure")
    a = ap.parse_args()
    tenure = os.path.realpath(a.tenure)
    port = free_port()
    with tempfile.TemporaryDirectory() as work:
        redis = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_for("redis", lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.startswith(b"PONG"))
            one_process, processes, single = tenure_rounds(tenure, f"redis://127.0.0.1:{port}", work, a.rounds)
            celery_burst, celery_single = celery_rounds(f"redis://127.0.0.1:{port}/1", work, a.rounds)
        finally:
            redis.terminate()
            redis.wait()
    print(f"{a.rounds} rounds; 3 workers each; {BURST} elections or tasks at once, then {SINGLE} one at a time")
    show("tenure: burst, one process (--from-file)", one_process)
    show("tenure: burst, one process per election", processes)
    show("tenure: one at a time (a process each)", single)
    show("Celery: burst, delay() x30 from one process", celery_burst)
    show("Celery: one at a time, delay().get()", celery_single)


if __name__ == "__main__":
    main()
