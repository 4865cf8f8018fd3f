"""Admission by free devices: a run starts only when every device its job holds is free, whole jobs only.
Pure: a job is a list of Ray resource bundles, each on one node; the driver and the benchmarks share Ledger."""

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

Bundle = Mapping[str, float]
_EPS = 1e-9


def place(bundles: Sequence[Bundle], free: Sequence[Bundle]) -> list[int] | None:
    """Node index for each bundle, all fitting together, or None if the job does not fit whole. Largest bundles first,
    best fit, so small jobs do not fragment the nodes a large one needs."""
    room = [dict(node) for node in free]
    order = sorted(range(len(bundles)), key=lambda i: -sum(bundles[i].values()))
    nodes: list[int | None] = [None] * len(bundles)
    for i in order:
        fits = [
            n
            for n in range(len(room))
            if all(room[n].get(key, 0.0) + _EPS >= amount for key, amount in bundles[i].items())
        ]
        if not fits:
            return None
        best = min(fits, key=lambda n: sum(room[n].get(key, 0.0) - amount for key, amount in bundles[i].items()))
        for key, amount in bundles[i].items():
            room[best][key] = room[best].get(key, 0.0) - amount
        nodes[i] = best
    return [int(n) for n in nodes]


def total(bundles: Sequence[Bundle], key: str) -> float:
    """How much of resource `key` a job's bundles hold together."""
    return float(sum(bundle.get(key, 0.0) for bundle in bundles))


@dataclass
class Ledger:
    """The cluster as the sweep admits on it: node totals less its own jobs, capped by the last free report less jobs
    admitted since, plus those released (None: trust the ledger alone); only the report shows other users' jobs."""

    nodes: list[dict[str, float]]
    observed: list[dict[str, float]] | None = None
    held: dict[Hashable, tuple[list[int], list[Bundle]]] = field(default_factory=dict)
    since_observed: set = field(default_factory=set)  # jobs admitted after the report
    released_since: list = field(default_factory=list)  # (nodes, bundles) of jobs that ended after the report

    def observe(self, free: list[dict[str, float]] | None) -> None:
        """A new report of each node's free resources (None: none to be had)."""
        self.observed = free
        self.since_observed = set()
        self.released_since = []

    def free(self) -> list[dict[str, float]]:
        free = _less([dict(node) for node in self.nodes], self.held.values())
        if self.observed is not None and len(self.observed) == len(free):
            # the report less the jobs admitted since, plus those that ended since (it may still count them)
            seen = _less(
                [dict(node) for node in self.observed],
                [self.held[key] for key in self.since_observed if key in self.held],
            )
            seen = _less(
                seen,
                [
                    (nodes, [{key: -amount for key, amount in bundle.items()} for bundle in bundles])
                    for nodes, bundles in self.released_since
                ],
            )
            free = [
                {key: min(amount, node_seen.get(key, amount)) for key, amount in node.items()}
                for node, node_seen in zip(free, seen)
            ]
        return free

    def fits_at_all(self, bundles: Sequence[Bundle]) -> bool:
        """Whether the job fits on the cluster when it is empty (else it can never start)."""
        return place(bundles, self.nodes) is not None

    def admit(self, key: Hashable, bundles: Sequence[Bundle]) -> bool:
        """Reserve the job's devices if it fits whole on the free devices now; False (nothing reserved) if not."""
        nodes = place(bundles, self.free())
        if nodes is None:
            return False
        self.held[key] = (nodes, list(bundles))
        self.since_observed.add(key)
        return True

    def adopt(self, key: Hashable, bundles: Sequence[Bundle]) -> None:
        """Hold the devices of a job already running (an earlier driver's); the last report already shows them taken."""
        nodes = place(bundles, _less([dict(node) for node in self.nodes], self.held.values()))
        if nodes is None:  # more than the ledger thinks free: it runs anyway, somewhere
            nodes = [0] * len(bundles)
        self.held[key] = (nodes, list(bundles))

    def release(self, key: Hashable) -> None:
        """The job ended: its devices are free again."""
        job = self.held.pop(key, None)
        if job is not None and key not in self.since_observed:
            self.released_since.append(job)
        self.since_observed.discard(key)

    def busy(self, resource: str) -> float:
        """How much of `resource` the sweep's own jobs hold."""
        return sum(total(bundles, resource) for _nodes, bundles in self.held.values())

    def capacity(self, resource: str) -> float:
        return float(sum(node.get(resource, 0.0) for node in self.nodes))


def _less(free: list[dict[str, float]], jobs) -> list[dict[str, float]]:
    for nodes, bundles in jobs:
        for n, bundle in zip(nodes, bundles):
            for key, amount in bundle.items():
                free[n][key] = free[n].get(key, 0.0) - amount
    return free


def first_wave(
    jobs: Sequence[tuple[Hashable, Sequence[Bundle]]], nodes: Sequence[Bundle], limit: int | None = None
) -> list[Hashable]:
    """Keys of `jobs` (key, bundles) that start at once on empty `nodes`, in queue order, at most `limit`."""
    ledger = Ledger([dict(node) for node in nodes])
    started = []
    for key, bundles in jobs:
        if limit is not None and len(started) >= limit:
            break
        if ledger.admit(key, bundles):
            started.append(key)
    return started
