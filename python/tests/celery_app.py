"""The Celery recipes of docs/python.md, as the tests run them.

- `LeaderScheduler`: run `celery -A celery_app beat -S celery_app.LeaderScheduler` on
  every host; only the beat that leads the election `celery/beat` sends the periodic
  tasks, and another takes over within the TTL when it stops or dies.
- `report`: a task that any number of workers may receive for the same day; its body
  runs once per day (`tenure.run_once`), however often it is sent.

The store and broker come from TENURE_STORE and CELERY_BROKER; RECIPE_LOG (a file)
records what happened, for the tests.
"""

import os
import time

import tenure
from celery import Celery
from celery.beat import PersistentScheduler

STORE = os.environ["TENURE_STORE"]
TTL = float(os.environ.get("RECIPE_TTL", "10"))
LOG = os.environ.get("RECIPE_LOG")

app = Celery("celery_app", broker=os.environ["CELERY_BROKER"])
app.conf.beat_schedule = {"sweep": {"task": "celery_app.sweep", "schedule": 1.0}}
app.conf.broker_connection_retry_on_startup = True


def record(line: str) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(f"{line} {os.getpid()} {time.monotonic()}\n")


class LeaderScheduler(PersistentScheduler):
    """Celery beat's scheduler, sending only while this beat leads."""

    def setup_schedule(self):
        super().setup_schedule()
        # Made here, in the beat's own process (after any fork).
        self.campaign = tenure.Campaign(STORE, "celery/beat", ttl=TTL)

    def tick(self, *args, **kwargs):
        if self.campaign.current() is None:
            return 0.2  # not leading: look again shortly
        return super().tick(*args, **kwargs)

    def apply_entry(self, entry, producer=None):
        record("sent")
        return super().apply_entry(entry, producer=producer)

    def close(self):
        self.campaign.close()  # hands over at once
        super().close()


@app.task
def sweep():
    record("swept")


@app.task
def report(day: str) -> str:
    def body(leadership, attempt):
        record(f"report-{day}-token-{leadership.token}")
        return "written"

    return tenure.run_once(STORE, "celery/reports", f"report-{day}", body, ttl=TTL).status
