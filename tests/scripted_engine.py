"""An engine that isolates rlscale.runner.engine_process from Ray on purpose: what its run does is named by the
run key, so a test drives each path of the child process (callbacks, a job's error, the process dying)."""

import os

from rlscale.runner.engine import Engine, JobResult


class ScriptedEngine(Engine):
    name = "scripted"

    def run(self, recipe, *, run_key, on_records, should_stop=None, progress=None, **_):
        if run_key == "exit":  # the process ends under the job, as Ray ends a driver whose node died
            os._exit(1)
        if progress is not None:
            progress({"step": 1})
        on_records([{"step": 1, "pid": os.getpid()}])
        reason = should_stop() if should_stop is not None else None
        return JobResult(steps=1, stopped=bool(reason), stop_reason=reason or "")
