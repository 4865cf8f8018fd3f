import os

import pytest
from rlscale.runner.engine_process import EngineLost, EngineProcess


def test_a_job_in_an_engine_process_is_answered_as_in_process_and_a_dead_process_raises_engine_lost():
    engine = EngineProcess("scripted", spec="scripted_engine:ScriptedEngine")
    try:
        records, shown = [], []
        result = engine.run(
            None, run_key="ok", on_records=records.extend, should_stop=lambda: "enough", progress=shown.append
        )
        assert result.steps == 1 and result.stopped and result.stop_reason == "enough"
        assert shown == [{"step": 1}] and records[0]["step"] == 1 and records[0]["pid"] != os.getpid()

        def store_down(records):
            raise ConnectionError("store down")

        with pytest.raises(ConnectionError, match="store down"):  # raised in the job, as an in-process callback's
            engine.run(None, run_key="ok", on_records=store_down)
        assert engine.nodes() is None and not engine.lost
        with pytest.raises(EngineLost, match="exit 1"):
            engine.run(None, run_key="exit", on_records=records.extend)
        assert engine.lost
        with pytest.raises(EngineLost):
            engine.nodes()
    finally:
        engine.close()
    engine.close()  # idempotent
