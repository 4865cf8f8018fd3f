"""Waiting out a database that went away (a PostgreSQL restart, a SQLite file held past the busy timeout): calls
retry with backoff up to a deadline; any other database error is raised at once."""

import functools
import threading
import time
from collections.abc import Callable

from rlscale.db.engine import StoreUnreachable
from sqlalchemy.exc import DBAPIError

# words in a driver's message when the database went away (or SQLite stayed locked), not when a statement was wrong
_GONE = (
    "connection",
    "server closed",
    "terminating",
    "shutting down",
    "could not connect",
    "the database system is",
    "database is locked",
)


def is_disconnect(err: BaseException) -> bool:
    """Whether a database error means the database is out of reach for now, not a bad statement."""
    if isinstance(err, StoreUnreachable):
        return True
    if not isinstance(err, DBAPIError):
        return False
    text = str(getattr(err, "orig", err)).lower()
    return bool(err.connection_invalidated) or any(word in text for word in _GONE)


class OutagePolicy:
    """How long (seconds; 0: not at all) the store's calls wait for a lost database, telling `on_note`; calls also
    take one lock, so the threads of one process write one at a time."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.on_note: Callable[[str], None] = lambda note: None
        self.lock = threading.RLock()

    def call(self, function: Callable, *args, **kwargs):
        deadline, delay, waited = time.monotonic() + self.seconds, 0.5, False
        while True:
            try:
                with self.lock:
                    result = function(*args, **kwargs)
            except (DBAPIError, StoreUnreachable) as err:
                if not is_disconnect(err) or time.monotonic() + delay > deadline:
                    raise
                waited = True
                text = str(getattr(err, "orig", None) or err).splitlines()[0][:60]
                self.on_note(f"store unreachable, retrying: {text}")
                time.sleep(delay)
                delay = min(5.0, delay * 2)
            else:
                if waited:
                    self.on_note("")
                return result


def waits_out_outages(method: Callable) -> Callable:
    """A Store method that goes through its OutagePolicy (self.outage)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return self.outage.call(method, self, *args, **kwargs)

    return wrapper
