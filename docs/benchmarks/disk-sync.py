#!/usr/bin/env python3
"""How long a commit-sized write and its fsync take on this machine's disk, back to back
and after the disk has been idle: the floor under every store that syncs a commit.

    python3 docs/benchmarks/disk-sync.py [DIR]      # DIR: where the store's files live (default /tmp)

Each sample writes three 4 KiB pages with their 24-byte frame headers (what SQLite appends
to its write-ahead log for one lease change) into a file written beforehand, so that the
file's size does not change, then fsyncs it. 'idle' waits 100 ms before each sample, as
a handover does after a quiet spell.
"""
import os
import sys
import time

def run(path, gap, n=200):
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        frame = 4096 + 24
        os.pwrite(fd, b"\0" * (frame * 3 * n), 0)
        os.fsync(fd)
        page = b"\7" * 4096
        times = []
        for i in range(n):
            if gap:
                time.sleep(gap)
            t0 = time.perf_counter()
            for k in range(3):
                at = (i * 3 + k) * frame
                os.pwrite(fd, page[:24], at)
                os.pwrite(fd, page, at + 24)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return times[n // 2] * 1e3, times[int(n * 0.99)] * 1e3

directory = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
path = os.path.join(directory, f"disk-sync-{os.getpid()}.tmp")
for label, gap in [("back to back", 0), ("idle 100 ms", 0.1)]:
    p50, p99 = run(path, gap)
    print(f"{label:<14} write + fsync  p50 {p50:.3f} ms  p99 {p99:.3f} ms")
