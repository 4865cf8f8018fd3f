"""An engine in a child process. Ray ends a driver whose node's raylet dies (its plasma store's pipe breaks), so a
sweep that replaces a dead local head keeps the builtin engine's Ray driver in a process it can afford to lose."""

import multiprocessing
import os
import pickle
import queue
import signal
import threading

from rlscale.runner.engine import ENGINES, Engine, JobResult, engine_class

SYNC_CALLBACKS = ("on_records", "should_stop", "resume_gpu_hours")  # the job waits for their answer, as in-process
CLOSE_SECONDS = 120.0  # how long close waits for the child to release its workers before killing it


class EngineLost(RuntimeError):
    """The engine's process ended under a call (its Ray head died, or something killed it)."""


class EngineProcess(Engine):
    """Engine `name` (the class at `spec`, default ENGINES[name]) made with `options` in a spawned process; run,
    devices, nodes and close are forwarded to it and run's callbacks answered from here. Thread-safe."""

    def __init__(self, name: str, *, spec: str | None = None, **options):
        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        target = (child, spec or ENGINES[name], options)
        self._process = context.Process(target=serve, args=target, name=f"rlscale {name} engine")
        self._process.start()
        child.close()
        self._lock, self._send_lock = threading.Lock(), threading.Lock()
        self._replies: dict[int, queue.Queue] = {}  # call id -> what the child said about it
        self._calls = 0
        self._lost = ""  # why the child is gone, once it is
        self._closed = False
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def lost(self) -> bool:
        """The child has ended: every call raises EngineLost (make a new engine)."""
        return bool(self._lost)

    def run(self, recipe, *, run_key: str, on_records, **options) -> JobResult:
        """See Engine.run: the job runs in the child; its callbacks are called here, on this thread."""
        callbacks = {"on_records": on_records}
        for key in ("should_stop", "progress", "resume_gpu_hours"):
            if (callback := options.pop(key, None)) is not None:
                callbacks[key] = callback
        call, replies = self._open()
        try:
            self._send("run", call, recipe, {"run_key": run_key, **options}, sorted(callbacks))
            while True:
                kind, value = self._reply(replies)
                if kind == "done":
                    return value
                name, args = value
                try:
                    answer = (True, callbacks[name](*args))
                except Exception as err:  # raised inside the job, as an in-process callback's error would be
                    answer = (False, err)
                if name in SYNC_CALLBACKS:
                    self._send("answer", call, _portable(answer))
        finally:
            self._forget(call)

    def devices(self, recipe) -> list[dict[str, float]]:
        return self._call("devices", recipe)

    def nodes(self) -> list | None:
        return self._call("nodes")

    def ended(self, run_key: str, status: str) -> None:
        self._call("ended", run_key, status)

    def close(self) -> None:
        """Close the engine in the child (its workers, its Ray driver), then end the child. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call("close")
        except EngineLost:
            pass
        self._process.join(CLOSE_SECONDS)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def end(self) -> None:
        """End the child now (SIGKILL), its calls failing with EngineLost: for a child whose Ray head is dead, which
        Ray would otherwise leave waiting on it for up to a minute."""
        self._process.kill()

    def _call(self, method: str, *args):
        call, replies = self._open()
        try:
            self._send("call", call, method, args)
            return self._reply(replies)[1]
        finally:
            self._forget(call)

    def _open(self) -> tuple[int, queue.Queue]:
        with self._lock:
            if self._lost:
                raise EngineLost(self._lost)
            self._calls += 1
            self._replies[self._calls] = replies = queue.Queue()
            return self._calls, replies

    def _forget(self, call: int) -> None:
        with self._lock:
            self._replies.pop(call, None)

    def _send(self, *message) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (OSError, ValueError):  # the child is gone: the reader tells every call why
                pass

    def _reply(self, replies: queue.Queue) -> tuple[str, object]:
        kind, value = replies.get()
        if kind == "lost":
            raise EngineLost(value)
        if kind == "raised":
            raise value
        return kind, value

    def _read(self) -> None:
        while True:
            try:
                kind, call, value = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                replies = self._replies.get(call)
            if replies is not None:
                replies.put((kind, value))
        self._process.join(10.0)
        code = self._process.exitcode
        with self._lock:
            self._lost = f"the {self.name} engine's process ended" + (f" (exit {code})" if code is not None else "")
            for replies in self._replies.values():
                replies.put(("lost", self._lost))


def serve(conn, spec: str, options: dict) -> None:
    """The child: make the engine at `spec`, answer the parent's calls (each run on a thread of its own) until it
    closes the engine or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the sweep's: it stops the jobs through close
    engine = engine_class(spec)(**options)
    send_lock = threading.Lock()
    answers: dict[int, queue.Queue] = {}

    def send(kind: str, call: int, value) -> None:
        with send_lock:
            conn.send((kind, call, value))

    def callback(call: int, key: str):
        def forward(*args):
            send("callback", call, (key, args))
            if key not in SYNC_CALLBACKS:
                return None
            ok, value = answers[call].get()
            if not ok:
                raise value
            return value

        return forward

    def work(call: int, method: str, args: tuple, kwargs: dict) -> None:
        try:
            reply = ("done", getattr(engine, method)(*args, **kwargs))
        except BaseException as err:
            reply = ("raised", _portable((False, err))[1])
        answers.pop(call, None)
        try:
            send(reply[0], call, reply[1])
        except (OSError, ValueError):  # the parent is gone
            pass

    while True:
        try:
            kind, call, *rest = conn.recv()
        except (EOFError, OSError):  # the sweep is gone: so are this driver's jobs (Ray ends a dead driver's actors)
            os._exit(0)
        if kind == "run":
            recipe, kwargs, keys = rest
            answers[call] = queue.Queue()
            kwargs |= {key: callback(call, key) for key in keys}
            threading.Thread(target=work, args=(call, "run", (recipe,), kwargs), daemon=True).start()
        elif kind == "answer":
            if call in answers:
                answers[call].put(rest[0])
        elif rest[0] == "close":
            work(call, "close", (), {})
            conn.close()
            os._exit(0)
        else:
            threading.Thread(target=work, args=(call, rest[0], rest[1], {}), daemon=True).start()


def _portable(answer: tuple[bool, object]) -> tuple[bool, object]:
    """`answer` as it can cross the pipe: an error that does not pickle becomes a RuntimeError with its text."""
    ok, value = answer
    if ok:
        return answer
    try:
        pickle.loads(pickle.dumps(value))
        return answer
    except Exception:
        return False, RuntimeError(f"{type(value).__name__}: {value}")
