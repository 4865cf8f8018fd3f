"""The `builtin` engine: each run is runner/builtin/job.run_job on Ray, served by a pool of worker sets (generator
and trainer actors) kept for the next job on the same model and devices, so consecutive runs skip actor start-up."""

import threading
from collections.abc import Callable
from dataclasses import dataclass

from rlscale.runner.engine import Engine, JobResult


@dataclass
class WorkerSet:
    """A generator and a trainer actor for recipes that share `key` (model, head precision, devices)."""

    key: tuple
    generator: object
    trainer: object


class BuiltinEngine(Engine):
    """Runs jobs on a Ray cluster: joins `ray_address` (HOST:PORT), RAY_ADDRESS's, or a local head started on first
    use (stopped on close); a process that already joined a cluster keeps it."""

    name = "builtin"

    def __init__(self, *, ray_address: str | None = None):
        self.ray_address = ray_address
        self._idle: list[WorkerSet] = []  # worker sets between jobs, ready for the next one with their key
        self._busy: list[WorkerSet] = []
        self._lock = threading.Lock()
        self._joined = False  # this engine connected the process's Ray driver (close disconnects it)
        self._head = None  # the local head it started, if any

    def run(
        self,
        recipe,
        *,
        run_key: str,
        on_records: Callable[[list[dict]], None],
        until_step: int | None = None,
        should_stop: Callable[[], str | None] | None = None,
        progress: Callable[[dict], None] | None = None,
        gpu_hours: float | None = None,
        resume_gpu_hours: Callable[[int], float | None] | None = None,
    ) -> JobResult:
        """See Engine.run (checkpoints carry their compute: resume_gpu_hours is unused). Thread-safe; on a dead actor
        (RayActorError) its worker set is killed before the error is raised, so a retry starts fresh ones."""
        import ray
        from rlscale.runner.builtin.job import run_job
        from rlscale.runner.builtin.local import resolve_model_dir

        self._ensure_ray(recipe)
        with self._lock:  # the tiny policy is built once, before any actor of any run reads it
            resolve_model_dir(recipe)
        workers = self._acquire(recipe)
        try:
            result = run_job(
                recipe,
                run_key=run_key,
                on_records=on_records,
                resume=True,
                ray_address=self.ray_address,
                generator=workers.generator,
                trainer=workers.trainer,
                progress=progress,
                should_stop=should_stop,
                until_step=until_step,
                gpu_hours=gpu_hours,
            )
        except ray.exceptions.RayActorError:
            self._release(workers, kill=True)
            raise
        except BaseException:
            self._release(workers, kill=False)
            raise
        self._release(workers, kill=False)
        return JobResult(
            steps=int(result["steps"]),
            stopped=bool(result.get("stopped")),
            compute_reached=bool(result.get("compute_reached")),
            stop_reason=result.get("stop_reason", ""),
            busy_seconds=float(result.get("busy_seconds", 0.0)),
            timings=dict(result.get("timings") or {}),
        )

    def devices(self, recipe) -> list[dict[str, float]]:
        """One node holding the generator's and the trainer's devices: GPUs on a cluster with GPUs, else CPU cores."""
        import ray

        self._ensure_ray(recipe)
        kind = "GPU" if ray.cluster_resources().get("GPU", 0) >= 1 else "CPU"
        return [{kind: float(recipe.generator_devices + recipe.trainer_devices)}]

    def nodes(self) -> list:
        """The cluster's nodes, idle worker sets' devices counted free (the pool frees them for another key's job)."""
        from rlscale.runner.cluster import Node, ray_nodes

        nodes = ray_nodes()
        with self._lock:
            idle = [self._held(workers) for workers in self._idle]
        out = []
        for node in nodes:
            free = dict(node.free)
            for held in idle:
                for key, amount in held.items():
                    if key in free:
                        free[key] = min(node.total[key], free[key] + amount)
            out.append(Node(node.total, free))
        return out

    def close(self) -> None:
        """Stop every worker set; leave the cluster if this engine joined it, and stop the local head it started."""
        with self._lock:
            sets, self._idle, self._busy = self._idle + self._busy, [], []
        for workers in sets:
            _kill(workers)
        if self._joined:
            from rlscale.runner.ray_head import disconnect

            disconnect(self._head)
            self._joined, self._head = False, None

    def _ensure_ray(self, recipe) -> None:
        import ray
        from rlscale.runner.ray_head import connect

        with self._lock:
            if ray.is_initialized():
                return
            self._head = connect(self.ray_address, cpus=recipe.generator_devices + recipe.trainer_devices)
            self._joined = True

    def _acquire(self, recipe) -> WorkerSet:
        # idle sets of other keys die first; reuse beats new actors (vLLM: 5-45 s to start, a trainer a few seconds)
        from rlscale.runner.builtin.generator import create_generator
        from rlscale.runner.builtin.trainer import create_trainer

        key = (recipe.model, recipe.fp32_head, recipe.head_precision, recipe.generator_devices, recipe.trainer_devices)
        with self._lock:
            match = next((workers for workers in self._idle if workers.key == key), None)
            others = [] if match is not None else [workers for workers in self._idle if workers.key != key]
            if match is not None:
                self._idle.remove(match)
                self._busy.append(match)
                return match
            self._idle = [workers for workers in self._idle if workers not in others]
        for workers in others:
            _kill(workers)
        workers = WorkerSet(key, None, None)
        with self._lock:
            self._busy.append(workers)
        try:
            workers.generator = create_generator(recipe)
            workers.trainer = create_trainer(recipe)
        except BaseException:
            self._release(workers, kill=True)
            raise
        return workers

    def _release(self, workers: WorkerSet, *, kill: bool) -> None:
        with self._lock:
            if workers in self._busy:
                self._busy.remove(workers)
            if not kill:
                self._idle.append(workers)
        if kill:
            _kill(workers)

    @staticmethod
    def _held(workers: WorkerSet) -> dict[str, float]:
        *_model_and_head, generator, trainer = workers.key  # the key ends with the devices each actor holds
        import ray

        kind = "GPU" if ray.cluster_resources().get("GPU", 0) >= 1 else "CPU"
        return {kind: float(generator + trainer)}


def _kill(workers: WorkerSet) -> None:
    import ray

    for actor in (workers.generator, workers.trainer):
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:  # already dead: nothing left to release
                pass
