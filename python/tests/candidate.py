"""A candidate process for the tests: `candidate.py STORE ELECTION TTL LOG MODE`.

MODE `hold`: leads once and holds the lease until killed or interrupted, writing
`elected TOKEN TIME` when elected. MODE `cycle:N:SECONDS`: leads N times, each term
SECONDS long (or until it ends early), writing `start PID TOKEN TIME` on entering and
`end PID TOKEN TIME` with the last moment it found the term valid. TIME is `time.monotonic()`, one clock for every
process of the host."""

import os
import sys
import time

import tenure

store, election, ttl, log, mode = sys.argv[1:6]


def write(line: str) -> None:
    with open(log, "a") as f:
        f.write(line + "\n")


if mode == "hold":
    with tenure.lead(store, election, ttl=float(ttl)) as leadership:
        write(f"elected {leadership.token} {time.monotonic()}")
        while True:
            time.sleep(0.05)
else:
    _, n, seconds = mode.split(":")
    for _ in range(int(n)):
        with tenure.lead(store, election, ttl=float(ttl)) as leadership:
            write(f"start {os.getpid()} {leadership.token} {time.monotonic()}")
            until = time.monotonic() + float(seconds)
            # The last moment known to lie within the term: read before a check that
            # found the term still valid.
            last = time.monotonic()
            while True:
                now = time.monotonic()
                if now >= until or not leadership.is_valid():
                    break
                last = now
                time.sleep(0.005)
            write(f"end {os.getpid()} {leadership.token} {last}")
        time.sleep(0.01)
