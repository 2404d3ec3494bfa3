"""Leader election for programs that run as several replicas.

One replica, and only one, does a piece of work at a time: it leads while it holds a
lease on a shared store, and proves its leadership to what it writes to with a fencing
token that grows with every new term. This is the Python face of tenure's Rust runtime;
stores are named by the same URLs as the ``tenure`` command takes (``sqlite:PATH``,
``postgres://…``, ``redis://…``, ``etcd://…``, …).

    import tenure

    with tenure.lead("sqlite:/var/lib/app/tenure.db", "reports/nightly", ttl=10) as leadership:
        write_report(fencing_token=leadership.token)

The block runs only while this process leads; leaving it releases the lease at once, so
the next replica takes over without waiting for the TTL. A term that ends early (lost,
evicted) makes ``leadership.is_valid()`` false before its deadline: check it between
steps, and pass ``leadership.token`` to every resource the work writes to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Callable, Iterator, Optional, Union

from . import _tenure

__all__ = [
    "Campaign",
    "Elected",
    "Leader",
    "LeaderChanged",
    "Leadership",
    "Observer",
    "OnceResult",
    "SteppedDown",
    "TenureError",
    "ended",
    "lead",
    "observe",
    "run_once",
]

#: Proof of leadership for one term (see ``tenure.lead``): ``token``, ``deadline``,
#: ``is_valid()``, ``remaining()``, ``wait(timeout)``, ``set_metadata(bytes)``.
Leadership = _tenure.Leadership


class TenureError(Exception):
    """An error of tenure's: the store refused or could not be reached, a name or setting
    was refused, or the campaign was shut down.

    ``kind`` says which: ``"unavailable"`` and ``"ambiguous"`` (the store could not be
    reached, or an answer was lost: worth retrying), ``"invalid"`` (a name, URL or setting
    refused), ``"unauthorized"`` (credentials or permissions), ``"misconfigured"`` (the
    store's setup), ``"shut_down"``, ``"term_ended"``, ``"timeout"``, ``"other"``.
    """

    def __init__(self, message: str, kind: str = "other") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def retryable(self) -> bool:
        """Whether trying again later may succeed."""
        return self.kind in ("unavailable", "ambiguous")


@dataclasses.dataclass(frozen=True)
class Leader:
    """Who leads an election: its holder id, its fencing token and its metadata."""

    holder: str
    token: int
    metadata: bytes

    @classmethod
    def _of(cls, d: Optional[dict]) -> Optional["Leader"]:
        return None if d is None else cls(d["holder"], d["token"], d["metadata"])


@dataclasses.dataclass(frozen=True)
class Elected:
    """This candidate leads, with this fencing token."""

    token: int


@dataclasses.dataclass(frozen=True)
class SteppedDown:
    """This candidate stopped leading. ``reason``: ``"renew_failed"``, ``"lost"``,
    ``"evicted"``, ``"resigned"``, ``"shutting_down"``, ``"deadline_passed"`` or
    ``"handed_over"``."""

    reason: str


@dataclasses.dataclass(frozen=True)
class LeaderChanged:
    """The leader as this candidate sees it changed; ``None`` when nobody leads."""

    leader: Optional[Leader]


Event = Union[Elected, SteppedDown, LeaderChanged]


class Campaign:
    """One candidate's campaign, in the background from the moment it is made.

    ``current()`` is the leadership while this candidate leads, ``wait_elected()`` waits
    for it, ``events()`` tells of elections and step-downs, and ``close()`` (or leaving a
    ``with`` block) stops campaigning and releases the lease at once. For work that runs
    for the whole of each term, ``tenure.lead`` is simpler.

    ``holder`` names this candidate (a suffix of its own is added, so that two processes
    given one name never take each other's lease); ``metadata`` (bytes) is published with
    the lease for observers.
    """

    def __init__(
        self,
        store: str,
        election: str,
        *,
        ttl: float = 10.0,
        holder: Optional[str] = None,
        metadata: Optional[bytes] = None,
    ) -> None:
        self._native = _tenure.Campaign(store, election, float(ttl), holder, metadata)
        self._closed = False

    @property
    def holder(self) -> str:
        """This candidate's holder id."""
        return self._native.holder

    @property
    def election(self) -> str:
        """The election's name."""
        return self._native.election

    def wait_elected(self, timeout: Optional[float] = None) -> Optional[Leadership]:
        """Waits until this candidate leads, at most ``timeout`` seconds (``None``: for
        ever); returns the leadership, or ``None`` when the time ran out."""
        return self._native.wait_elected(timeout)

    def current(self) -> Optional[Leadership]:
        """The leadership if this candidate leads right now, else ``None``: never one
        whose deadline has passed."""
        return self._native.current()

    def is_healthy(self) -> bool:
        """Whether the campaign works: false once it stopped on an error no retry mends
        (credentials, permissions)."""
        return self._native.is_healthy()

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """The events from now on: ``Elected``, ``SteppedDown``, ``LeaderChanged``. Ends
        when no event comes within ``timeout`` seconds (``None``: never) or the campaign
        is closed."""
        while True:
            try:
                e = self._native.next_event(timeout)
            except TenureError as err:
                if err.kind == "shut_down":
                    return
                raise
            if e is None:
                return
            what, value = e
            if what == "elected":
                yield Elected(value)
            elif what == "stepped_down":
                yield SteppedDown(value)
            elif what == "leader_changed":
                yield LeaderChanged(Leader._of(value))

    def close(self) -> None:
        """Stops campaigning: the current term ends, the lease is released at once (the
        next candidate is elected without waiting for the TTL), then this returns."""
        if not self._closed:
            self._closed = True
            self._native.close()

    def __enter__(self) -> "Campaign":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class lead:
    """Leads an election for the length of a ``with`` (or ``async with``) block.

    Entering blocks until this process leads (at most ``timeout`` seconds, else a
    ``TenureError`` of kind ``"timeout"``) and gives the ``Leadership``; leaving the
    block, by its end or by an exception (``KeyboardInterrupt`` included), releases the
    lease at once. The GIL is released while waiting. ``ttl`` is the lease's length in
    seconds: a leader that dies is replaced within it.
    """

    def __init__(
        self,
        store: str,
        election: str,
        ttl: float = 10.0,
        *,
        holder: Optional[str] = None,
        metadata: Optional[bytes] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._args = (store, election)
        self._kwargs = dict(ttl=ttl, holder=holder, metadata=metadata)
        self._timeout = timeout
        self._campaign: Optional[Campaign] = None
        self._leadership: Optional[Leadership] = None

    def _timed_out(self) -> TenureError:
        return TenureError(f"not elected within {self._timeout} s", "timeout")

    def __enter__(self) -> Leadership:
        campaign = Campaign(*self._args, **self._kwargs)
        try:
            leadership = campaign.wait_elected(self._timeout)
            if leadership is None:
                raise self._timed_out()
        except BaseException:
            campaign.close()
            raise
        self._campaign, self._leadership = campaign, leadership
        return leadership

    def __exit__(self, *exc: Any) -> None:
        self._end()

    def _end(self) -> None:
        if self._leadership is not None:
            self._leadership.release()
        if self._campaign is not None:
            self._campaign.close()
        self._campaign = self._leadership = None

    async def __aenter__(self) -> Leadership:
        loop = asyncio.get_running_loop()
        campaign = await loop.run_in_executor(None, lambda: Campaign(*self._args, **self._kwargs))
        started = time.monotonic()
        try:
            while True:
                # Short waits on a worker thread: a cancelled task stops waiting at once,
                # and the thread's wait ends within a quarter of a second.
                leadership = await loop.run_in_executor(None, campaign.wait_elected, 0.25)
                if leadership is not None:
                    break
                if self._timeout is not None and time.monotonic() - started >= self._timeout:
                    raise self._timed_out()
        except BaseException:
            await asyncio.shield(loop.run_in_executor(None, campaign.close))
            raise
        self._campaign, self._leadership = campaign, leadership
        return leadership

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._end)


async def ended(leadership: Leadership) -> None:
    """Waits, in asyncio, until ``leadership``'s term ends (lost, evicted, released, or
    its deadline passed)."""
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, leadership.wait, 0.25):
        pass


class Observer:
    """Who leads an election, for processes that do not campaign (see ``observe``)."""

    def __init__(self, store: str, election: str) -> None:
        self._native = _tenure.Observer(store, election)

    def leader(self) -> Optional[Leader]:
        """The leader as last seen, or ``None`` (nobody leads, or no reading yet)."""
        return Leader._of(self._native.leader())

    def wait_change(self, timeout: Optional[float] = None) -> Optional[Leader]:
        """Waits for the first reading, then for each change of leader or of its
        metadata, at most ``timeout`` seconds; returns the leader then in force."""
        return Leader._of(self._native.wait_change(timeout))


def observe(store: str, election: str) -> Observer:
    """Watches who leads ``election``, kept current in the background."""
    return Observer(store, election)


@dataclasses.dataclass(frozen=True)
class OnceResult:
    """What ``run_once`` came to. ``status``: ``"ran"`` (``output``, ``token``,
    ``attempt``; ``recorded`` is false only when the term ended before the key could be
    marked done), ``"already_done"`` (``holder`` and ``token`` of the run that did it) or
    ``"refused"`` (``reason``: attempts used up, or an at-most-once key that may have
    started before)."""

    status: str
    output: Any = None
    token: Optional[int] = None
    attempt: Optional[int] = None
    recorded: bool = False
    holder: Optional[str] = None
    reason: Optional[str] = None


def run_once(
    store: str,
    election: str,
    key: str,
    task: Callable[[Leadership, int], Any],
    *,
    ttl: float = 10.0,
    attempts: int = 1,
    at_most_once: bool = False,
    holder: Optional[str] = None,
) -> OnceResult:
    """Runs ``task(leadership, attempt)`` once for ``key`` across every replica that
    calls this for the same election: only while this process leads, only if no run of
    the key has finished, never while another run of it goes on. A key done already is
    answered at once. The task gets the term's leadership (pass its token to what it
    writes) and the run's number; if it raises, the run counts as failed, the key stays
    open for another attempt (up to ``attempts`` runs in all), and the exception is
    raised here. With ``at_most_once``, a run that may have started is never repeated.
    """
    got = _tenure.run_once(store, election, key, task, float(ttl), int(attempts), bool(at_most_once), holder)
    status = got[0]
    if status == "ran":
        _, output, token, attempt, recorded = got
        return OnceResult("ran", output=output, token=token, attempt=attempt, recorded=recorded)
    if status == "already_done":
        return OnceResult("already_done", holder=got[1], token=got[2])
    if status == "failed":
        raise got[1]
    return OnceResult("refused", reason=got[1])
