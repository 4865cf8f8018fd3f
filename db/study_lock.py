"""One sweep driver per study and store: a lock the OS or database server releases when its process dies
(kill -9 included), so a rerun never waits for a dead holder; drivers in one process share it."""

import fcntl
import hashlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import URL, Engine

from rlscale.base.errors import UserError

_held: dict[str, list] = {}  # lock key -> [lock, drivers of this process holding it]
_held_lock = threading.Lock()


class StudyBusy(UserError):
    """Another driver holds the study: one line naming it."""


def holder_text() -> str:
    """Who takes a lock: this process, host and start time, e.g. 'pid 4242 on node-1 since 12:30:05'."""
    return f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}"


def acquire(engine: Engine, url: URL, shown: str, study: str) -> "StudyLock":
    """The study's lock for this process (shared by its drivers); StudyBusy when another process holds it."""
    key = _key(url, shown, study)
    with _held_lock:
        entry = _held.get(key)
        if entry is None:
            lock = _FileLock(url.database, key) if url.get_backend_name() == "sqlite" else _ServerLock(engine, key)
            holder = lock.try_take()
            if holder is not None:
                raise StudyBusy(
                    f"study {study!r} is being swept by another driver ({holder}); wait for it to end, or stop it "
                    "and run the sweep again",
                    field="study",
                )
            entry = _held[key] = [lock, 0]
        entry[1] += 1
        return StudyLock(key)


def is_held(engine: Engine, url: URL, shown: str, study: str) -> bool | None:
    """Whether a sweep driver holds the study now, read without taking its lock (a driver starting meanwhile must
    not find it taken); None where this cannot be told (a SQLite store's holder on another host)."""
    key = _key(url, shown, study)
    with _held_lock:
        if key in _held:
            return True
    if url.get_backend_name() == "sqlite":
        return _FileLock(url.database, key).is_held()
    return _ServerLock(engine, key).is_held()


def _key(url: URL, shown: str, study: str) -> str:
    return hashlib.sha256(f"{shown}|{url.query}|{study}".encode()).hexdigest()


class StudyLock:
    """One driver's hold on its study's lock; `release` once."""

    def __init__(self, key: str):
        self.key = key
        self.released = False

    def ensure(self) -> bool:
        """Whether the lock is still this process's, taken again if its connection was lost (a server restart);
        False when another driver took it meanwhile."""
        with _held_lock:
            entry = _held.get(self.key)
            return entry is not None and entry[0].ensure()

    def release(self) -> None:
        """Give up this driver's hold; the lock goes when the process's last driver lets go."""
        with _held_lock:
            if self.released:
                return
            self.released = True
            entry = _held.get(self.key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del _held[self.key]
                entry[0].release()


class _FileLock:
    def __init__(self, database: str | None, key: str):
        self.path = None if database in (None, "", ":memory:") else Path(f"{database}-sweep-{key[:12]}.lock")
        self.fd: int | None = None

    def try_take(self) -> str | None:
        """None when taken; else who holds it."""
        if self.path is None:  # an in-memory store lives in this process only
            return None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:  # a read-only store: its first write says so, in one line
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 500, 0).decode(errors="replace").strip()
                os.close(fd)
                try:
                    return json.loads(holder)["holder"]
                except (ValueError, KeyError, TypeError):
                    return "holder unknown"
            try:  # the file may have been removed by a holder that let go between our open and our flock
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                named = {"holder": holder_text(), "pid": os.getpid(), "host": socket.gethostname()}
                os.pwrite(fd, json.dumps(named).encode(), 0)
                self.fd = fd
                return None
            os.close(fd)

    def is_held(self) -> bool | None:
        """Whether the process the lock file names is alive (the file outlives a driver killed with -9)."""
        if self.path is None:
            return False
        try:
            named = json.loads(self.path.read_text())
        except FileNotFoundError:
            return False  # a driver removes it as it lets go
        except (OSError, ValueError):
            return None  # being written, or unreadable
        if not isinstance(named, dict) or named.get("host") != socket.gethostname() or "pid" not in named:
            return None  # a holder on another host (a store on a shared disk)
        try:
            os.kill(int(named["pid"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive: another user's
            return True
        return True

    def ensure(self) -> bool:
        return True

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked: the next driver makes a new file
            os.close(self.fd)
            self.fd = None


# the advisory lock :n, granted to some session of this database
_GRANTED = (
    "l.locktype = 'advisory' AND l.granted AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = ((:n >> 32) & 4294967295)::oid AND l.objid = (:n & 4294967295)::oid"
)


class _ServerLock:
    def __init__(self, engine: Engine, key: str):
        self.engine = engine
        self.number = int.from_bytes(bytes.fromhex(key[:16]), "big", signed=True)
        self.connection = None
        self.holder = holder_text()

    def try_take(self) -> str | None:
        connection = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        name = f"rlscale sweep: {self.holder}"[:63]
        connection.execute(text("SELECT set_config('application_name', :name, false)"), {"name": name})
        if connection.scalar(text("SELECT pg_try_advisory_lock(:n)"), {"n": self.number}):
            self.connection = connection
            return None
        holder = connection.scalar(
            text(
                f"SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE {_GRANTED}"
            ),
            {"n": self.number},
        )
        connection.close()
        return (holder or "holder unknown").removeprefix("rlscale sweep: ")

    def is_held(self) -> bool:
        with self.engine.connect() as connection:
            return bool(
                connection.scalar(text(f"SELECT count(*) FROM pg_locks l WHERE {_GRANTED}"), {"n": self.number})
            )

    def ensure(self) -> bool:
        try:
            self.connection.scalar(text("SELECT 1"))
            return True
        except Exception:  # the server restarted: the session, and the lock with it, are gone
            pass
        try:
            self.connection.invalidate()
            self.connection.close()
        except Exception:
            pass
        self.connection = None
        try:
            return self.try_take() is None
        except Exception:  # still down: the store's own calls wait for it
            return True

    def release(self) -> None:
        if self.connection is not None:
            try:
                self.connection.execute(text("SELECT pg_advisory_unlock(:n)"), {"n": self.number})
                self.connection.close()
            except Exception:  # the server went away: the lock went with the session
                pass
            self.connection = None
