"""tenure.lead and friends against real stores: SQLite files and a throwaway Redis, with
real processes that take turns, are killed and are interrupted."""

import asyncio
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import tenure
from conftest import PYTHON, RedisServer

CANDIDATE = str(Path(__file__).with_name("candidate.py"))


def spawn(store, election, ttl, log, mode):
    return subprocess.Popen([PYTHON, CANDIDATE, store, election, str(ttl), str(log), mode])


def lines(log: Path, what: str):
    if not log.exists():
        return []
    return [line.split()[1:] for line in log.read_text().splitlines() if line.startswith(what + " ")]


def wait_for(check, within: float, what: str):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"{what} within {within} s")


def test_candidates_in_several_processes_never_lead_at_once_and_tokens_grow(store, tmp_path):
    log = tmp_path / "terms"
    procs = [spawn(store, "py/turns", 2, log, "cycle:6:0.1") for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    starts, ends = lines(log, "start"), lines(log, "end")
    assert len(starts) == len(ends) == 18
    terms = {}
    for pid, token, t in starts:
        terms[(pid, int(token))] = [float(t), None]
    for pid, token, t in ends:
        terms[(pid, int(token))][1] = float(t)
    ordered = sorted(terms.items(), key=lambda kv: kv[1][0])
    for (prev, (_, prev_end)), (nxt, (nxt_start, _)) in zip(ordered, ordered[1:]):
        assert nxt_start > prev_end, f"{nxt} began at {nxt_start} while {prev} led until {prev_end}"
        assert nxt[1] > prev[1], f"token {nxt[1]} of a later term is not above {prev[1]}"
    # Every process led.
    assert len({pid for pid, _ in terms}) == 3


def test_a_killed_leader_is_replaced_within_its_ttl_by_a_larger_token(store, tmp_path):
    ttl = 2.0
    log_a, log_b = tmp_path / "a", tmp_path / "b"
    a = spawn(store, "py/kill", ttl, log_a, "hold")
    try:
        # The first election on a fresh Redis may wait one TTL (its restart guard).
        token_a = int(wait_for(lambda: lines(log_a, "elected"), 30, "a was not elected")[0][0])
        b = spawn(store, "py/kill", ttl, log_b, "hold")
        time.sleep(0.5)
        assert not lines(log_b, "elected"), "b led beside a"
        a.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        token_b, at = wait_for(lambda: lines(log_b, "elected"), ttl + 2, "b did not take over")[0]
        assert float(at) - killed < ttl + 2
        assert int(token_b) > token_a
    finally:
        for p in (a, locals().get("b")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_leaving_the_block_or_an_interrupt_hands_over_at_once(store, tmp_path):
    # A TTL far longer than the test allows: only a release lets the next one in (and
    # a fresh Redis would hold its first grant back for as long: its guard is off).
    ttl = 30
    store = store + "?restart_guard=off" if store.startswith("redis") else store
    log_a, log_b = tmp_path / "a", tmp_path / "b"
    a = spawn(store, "py/interrupt", ttl, log_a, "hold")
    b = None
    try:
        wait_for(lambda: lines(log_a, "elected"), 60, "a was not elected")
        b = spawn(store, "py/interrupt", ttl, log_b, "hold")
        time.sleep(0.5)
        # Ctrl-C in the block: KeyboardInterrupt leaves it, and the lease is released.
        a.send_signal(signal.SIGINT)
        asked = time.monotonic()
        assert a.wait(timeout=10) != 0
        _, at = wait_for(lambda: lines(log_b, "elected"), 5, "b was not elected after a's release")[0]
        assert float(at) - asked < 5
        # Ctrl-C while waiting to lead ends the wait too.
        c = spawn(store, "py/interrupt", ttl, tmp_path / "c", "hold")
        time.sleep(1.0)
        c.send_signal(signal.SIGINT)
        assert c.wait(timeout=5) != 0
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_waiting_releases_the_gil_and_a_timeout_is_a_tenure_error(sqlite_url):
    counted = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counted[0] += 1

    with tenure.lead(sqlite_url, "py/gil", ttl=5):
        t = threading.Thread(target=count)
        t.start()
        try:
            with pytest.raises(tenure.TenureError) as e:
                with tenure.lead(sqlite_url, "py/gil", ttl=5, timeout=1.0):
                    pass
        finally:
            stop.set()
            t.join()
    assert e.value.kind == "timeout"
    # A thread that needs the GIL ran on while the main thread waited.
    assert counted[0] > 10_000


def test_a_term_that_ends_early_is_invalid_before_its_deadline(tmp_path):
    server = RedisServer(tmp_path)
    try:
        url = server.url + "?restart_guard=off"
        with tenure.lead(url, "py/lost", ttl=6) as leadership:
            deadline = leadership.deadline
            assert leadership.is_valid() and deadline - time.monotonic() > 4
            # The lease taken away behind the leader's back (as an eviction would).
            server.command("DEL", "tenure:lease:py/lost")
            assert leadership.wait(timeout=5), "the term did not end"
            assert not leadership.is_valid()
            assert time.monotonic() < deadline
    finally:
        server.stop()


def test_errors_carry_their_kind_and_hide_passwords(tmp_path):
    with pytest.raises(tenure.TenureError) as e:
        tenure.lead("sqlite:", "py/e").__enter__()
    assert e.value.kind == "invalid" and "names no file" in str(e.value)
    with pytest.raises(tenure.TenureError) as e:
        tenure.lead(f"sqlite:{tmp_path}/e.db", "no spaces allowed").__enter__()
    assert e.value.kind == "invalid"
    with pytest.raises(tenure.TenureError) as e:
        tenure.lead(f"sqlite:{tmp_path}/e.db", "py/e", ttl=-1).__enter__()
    assert e.value.kind == "invalid"
    server = RedisServer(tmp_path, password="right-one")
    try:
        wrong = f"redis://:wrong-one@127.0.0.1:{server.port}/0"
        with pytest.raises(tenure.TenureError) as e:
            tenure.lead(wrong, "py/e", timeout=20).__enter__()
        assert e.value.kind == "unauthorized", e.value
        assert "wrong-one" not in str(e.value)
    finally:
        server.stop()


def test_events_tell_of_election_and_step_down(sqlite_url):
    with tenure.Campaign(sqlite_url, "py/events", ttl=5) as campaign:
        leadership = campaign.wait_elected(timeout=10)
        assert leadership is not None
        seen = list(campaign.events(timeout=0.5))
    # Made before the first election, the campaign saw it.
    assert tenure.Elected(leadership.token) in seen or any(isinstance(e, tenure.LeaderChanged) for e in seen)
    other = tenure.Campaign(sqlite_url, "py/events", ttl=5)
    events = other.events(timeout=10)
    leader_seen = next(e for e in events if isinstance(e, tenure.Elected))
    assert leader_seen.token > leadership.token
    other.close()


def test_observers_see_the_leader_and_its_change(sqlite_url):
    observer = tenure.observe(sqlite_url, "py/observed")
    assert observer.wait_change(timeout=5) is None
    with tenure.lead(sqlite_url, "py/observed", ttl=5, metadata=b"host-a") as leadership:
        seen = observer.wait_change(timeout=5)
        assert seen == tenure.Leader(leadership.holder, leadership.token, b"host-a")
    assert observer.wait_change(timeout=5) is None


def test_asyncio_leads_in_turn_and_a_cancelled_wait_leaves_nothing_held(sqlite_url):
    async def main():
        order = []

        async def worker(name):
            async with tenure.lead(sqlite_url, "py/async", ttl=5) as leadership:
                order.append((name, "in", leadership.token))
                await asyncio.sleep(0.2)
                order.append((name, "out", leadership.token))

        await asyncio.gather(worker("a"), worker("b"))
        # Each term ended before the next began.
        assert [o[1] for o in order] == ["in", "out", "in", "out"], order
        assert order[2][2] > order[0][2]
        # A wait cancelled while another holds the lease...
        async with tenure.lead(sqlite_url, "py/async", ttl=5):
            waiting = asyncio.ensure_future(tenure.lead(sqlite_url, "py/async", ttl=5).__aenter__())
            await asyncio.sleep(0.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        # ...holds nothing afterwards: the next one is elected at once.
        started = time.monotonic()
        async with tenure.lead(sqlite_url, "py/async", ttl=5, timeout=3) as leadership:
            assert leadership.is_valid()
        assert time.monotonic() - started < 3

    asyncio.run(main())


def test_run_once_runs_a_key_once_across_processes(sqlite_url, tmp_path):
    marker = tmp_path / "ran"
    script = (
        "import sys, tenure\n"
        "def task(leadership, attempt):\n"
        f"    open({str(marker)!r}, 'a').write(f'{{leadership.token}}\\n')\n"
        "    return 'made'\n"
        f"r = tenure.run_once({sqlite_url!r}, 'py/once', 'report-2026-11-28', task, ttl=5)\n"
        "print(r.status)\n"
    )
    procs = [subprocess.Popen([PYTHON, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    statuses = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert statuses == ["already_done", "already_done", "ran"], statuses
    assert len(marker.read_text().splitlines()) == 1

    # A task that raises leaves the key open, and the exception comes back.
    def fails(leadership, attempt):
        raise ValueError("no data yet")

    with pytest.raises(ValueError):
        tenure.run_once(sqlite_url, "py/once", "flaky", fails, ttl=5, attempts=2)
    again = tenure.run_once(sqlite_url, "py/once", "flaky", lambda l, attempt: attempt, ttl=5, attempts=2)
    assert again.status == "ran" and again.output == 2
