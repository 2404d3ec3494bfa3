"""The Celery recipes (celery_app.py) with real Celery beats and workers on a throwaway
Redis broker: one beat sends at a time and another takes over when it is killed; a task
sent many times for one key runs its body once."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PYTHON, RedisServer

celery = pytest.importorskip("celery") if os.environ.get("TENURE_REQUIRE_SERVERS") != "1" else __import__("celery")

HERE = Path(__file__).parent


def events(log: Path, what: str):
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if parts[0] == what:
            out.append((int(parts[1]), float(parts[2])))
    return out


class Recipe:
    def __init__(self, tmp_path, ttl):
        self.redis = RedisServer(tmp_path)
        self.tmp = tmp_path
        self.log = tmp_path / "recipe.log"
        self.env = dict(
            os.environ,
            TENURE_STORE=f"redis://127.0.0.1:{self.redis.port}/0",
            CELERY_BROKER=f"redis://127.0.0.1:{self.redis.port}/1",
            RECIPE_TTL=str(ttl),
            RECIPE_LOG=str(self.log),
            PYTHONPATH=str(HERE),
        )
        self.procs = []

    def start(self, *args):
        p = subprocess.Popen(
            [PYTHON, "-m", "celery", "-A", "celery_app", *args],
            cwd=self.tmp,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.tmp / f"celery-{len(self.procs)}.log", "w"),
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def beat(self, n):
        return self.start("beat", "-S", "celery_app.LeaderScheduler", "--schedule", str(self.tmp / f"beat-{n}"), "--max-interval", "1")

    def worker(self, name, *extra):
        return self.start("worker", "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", *extra)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.redis.stop()


@pytest.fixture
def recipe(tmp_path):
    made = []

    def make(ttl):
        r = Recipe(tmp_path, ttl)
        made.append(r)
        return r

    yield make
    for r in made:
        r.stop()


def wait_until(check, within, what):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {within} s")


def test_only_the_leading_beat_sends_and_another_takes_over_when_it_dies(recipe):
    ttl = 2.0
    r = recipe(ttl)
    r.worker("w1", "--pool", "solo")
    beats = {r.beat(1).pid: None, r.beat(2).pid: None}
    wait_until(lambda: len(events(r.log, "swept")) >= 3, 60, "three sweeps did not run")
    time.sleep(3)
    sent = events(r.log, "sent")
    senders = {pid for pid, _ in sent}
    assert len(senders) == 1, f"more than one beat sent: {senders}"
    # One send a second, not one per beat.
    times = [t for _, t in sent]
    assert all(b - a > 0.5 for a, b in zip(times, times[1:])), times
    leader = senders.pop()
    assert leader in beats
    os.killpg(leader, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: any(pid != leader for pid, _ in events(r.log, "sent")), ttl + 3, "no beat took over")
    first = min(t for pid, t in events(r.log, "sent") if pid != leader)
    assert first - killed < ttl + 3
    wait_until(lambda: any(t > first for _, t in events(r.log, "swept")), 10, "the new beat's sweeps did not run")


def test_a_task_sent_many_times_for_one_key_runs_its_body_once(recipe):
    r = recipe(5.0)
    # Two workers, one of them forking its pool's processes.
    r.worker("w1", "--pool", "solo")
    r.worker("w2", "--pool", "prefork", "--concurrency", "2")
    script = (
        "import celery_app\n"
        "results = [celery_app.report.delay('2026-11-28') for _ in range(6)]\n"
    )
    subprocess.run([PYTHON, "-c", script], env=r.env, cwd=r.tmp, check=True, timeout=60)

    def bodies():
        return [line for line in r.log.read_text().splitlines() if line.startswith("report-")] if r.log.exists() else []

    wait_until(lambda: len(bodies()) >= 1, 60, "the report did not run")
    # Every copy has had time to be received and answered.
    time.sleep(5)
    assert len(bodies()) == 1, bodies()
