"""Gossip elections: one action run on exactly one live worker of a group, over a message
broker (Redis pub/sub or AMQP), with no lease store. Workers are `tenure gossip worker`
processes (docs/gossip.md)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from . import _tenure

__all__ = ["Outcome", "elect"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What came of an election: the ``winner`` (a worker id; ``None`` if no worker
    handles the topic), whether it ``started`` the action, why not (``error``), and
    whether the id had been decided before (``repeat``: the outcome is that earlier
    one's, and nothing ran again)."""

    id: str
    topic: str
    winner: Optional[str]
    started: bool
    error: Optional[str]
    repeat: bool


def elect(
    broker: str,
    topic: str,
    action: str,
    id: str,
    *,
    group: str = "default",
    wait: float = 30.0,
) -> Outcome:
    """Asks the workers of ``group`` on ``broker`` (``redis://…`` or ``amqp://…``) to elect
    one of them to run ``action`` under ``topic`` (a ``--handler TOPIC=CMD`` of the
    workers) for the election ``id``, and waits up to ``wait`` seconds for the outcome.
    Asking again with the same ``id`` runs nothing twice. Raises ``tenure.TenureError``
    (kind ``"timeout"`` when no worker answers in time, ``"invalid"`` for a bad URL, id
    or topic, ``"unavailable"`` when the broker cannot be reached). The GIL is released
    while waiting."""
    d = _tenure.gossip_elect(broker, group, id, topic, action, float(wait))
    return Outcome(**d)
