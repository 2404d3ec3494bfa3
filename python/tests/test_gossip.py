"""tenure.gossip.elect against real `tenure gossip worker` processes on a throwaway Redis
broker: one worker runs the action, and the same id asked again runs nothing twice."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tenure
import tenure.gossip
from conftest import RedisServer


def tenure_binary():
    """The `tenure` command: TENURE_BIN, else the build directory's, else PATH's."""
    target = os.environ.get("CARGO_TARGET_DIR", str(Path(__file__).parents[2] / "target"))
    for candidate in (os.environ.get("TENURE_BIN"), f"{target}/debug/tenure", shutil.which("tenure")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    why = "no tenure binary (build it with cargo build -p tenure-cli, or set TENURE_BIN)"
    if os.environ.get("TENURE_REQUIRE_SERVERS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def test_one_worker_runs_the_action_and_an_id_asked_again_runs_nothing_twice(tmp_path):
    binary = tenure_binary()
    server = RedisServer(tmp_path)
    broker = f"redis://127.0.0.1:{server.port}"
    ran = tmp_path / "ran"
    workers = []
    try:
        for n in range(2):
            out = open(tmp_path / f"w{n}.out", "w")
            workers.append(
                subprocess.Popen(
                    [binary, "gossip", "worker", "--broker", broker, "--group", "py", "--id", f"w{n}",
                     "--heartbeat", "200ms", "--handler", f"report=echo $TENURE_GOSSIP_ACTION >> {ran}"],
                    stdout=out,
                    stderr=subprocess.DEVNULL,
                )
            )
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"w{n}.out").read_text().startswith("joined") for n in range(2)):
            assert time.monotonic() < deadline, "the workers did not join"
            time.sleep(0.05)
        first = tenure.gossip.elect(broker, "report", "day-1", "e-1", group="py", wait=20)
        assert first.winner in ("w0", "w1") and first.started and not first.repeat, first
        again = tenure.gossip.elect(broker, "report", "day-1", "e-1", group="py", wait=20)
        assert again.repeat and again.winner == first.winner, again
        time.sleep(0.5)
        assert ran.read_text().split() == ["day-1"]
        with pytest.raises(tenure.TenureError) as e:
            tenure.gossip.elect("http://nowhere", "report", "x", "e-2", wait=1)
        assert e.value.kind == "invalid"
    finally:
        for w in workers:
            w.kill()
            w.wait()
        server.stop()
