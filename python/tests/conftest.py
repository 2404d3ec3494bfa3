"""Fixtures: a fresh SQLite store per test, and a throwaway Redis server on a free
loopback port with its own directory, stopped by its process id."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest


def require_or_skip(program: str, package: str) -> str:
    """The path of `program`; a skip (a failure under TENURE_REQUIRE_SERVERS=1) without it."""
    path = shutil.which(program)
    if path is None:
        why = f"{program} is not installed; install the Debian package {package}"
        if os.environ.get("TENURE_REQUIRE_SERVERS") == "1":
            pytest.fail(why + " (TENURE_REQUIRE_SERVERS=1)")
        pytest.skip(why)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port: int, *args: str) -> bytes:
    """Sends one command; returns the raw reply."""
    req = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(req)
        return s.recv(65536)


class RedisServer:
    def __init__(self, directory, password=None):
        program = require_or_skip("redis-server", "redis-server")
        self.port = free_port()
        self.password = password
        args = [program, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory)]
        args += ["--save", "", "--appendonly", "no"]
        if password:
            args += ["--requirepass", password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                # Served: it answers (NOAUTH counts as an answer).
                if redis_command(self.port, "PING"):
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        if self.password:
            args = ("AUTH", self.password) + args
        return redis_command(self.port, *args)

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:{tmp_path / 'tenure.db'}"


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    """A store URL of each kind."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path / 'tenure.db'}"
    else:
        server = RedisServer(tmp_path)
        yield server.url
        server.stop()


PYTHON = sys.executable
