"""What a Ray cluster has and has free, per node, as the sweep admits jobs on it: read from a connected Ray driver
(the builtin engine) or from the dashboard's HTTP API (the Jobs-API engines, which never join the cluster)."""

from dataclasses import dataclass

# the resources admission counts; Ray's others (memory, object store, node:<ip>) are not devices
DEVICES = ("GPU", "CPU", "TPU")


@dataclass(frozen=True)
class Node:
    """One alive node: total and free devices by Ray resource name ({"GPU": 8.0}); free None until reported."""

    total: dict
    free: dict | None


def ray_nodes() -> list[Node]:
    """The nodes of the cluster this process's Ray driver is connected to (ray.init first)."""
    import ray
    from ray._private.state import state

    available = state.available_resources_per_node()
    nodes = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        total = _devices(node.get("Resources", {}))
        if total:
            free = _devices(available.get(node["NodeID"], {}))
            nodes.append(Node(total, {key: free.get(key, 0.0) for key in total}))
    return nodes


def dashboard_nodes(client) -> list[Node] | None:
    """The nodes of the cluster behind a Jobs API client (ray.job_submission.JobSubmissionClient), from the
    dashboard's cluster status (refreshed by Ray every few seconds); None when the dashboard does not report it."""
    response = client._do_request("GET", "/api/cluster_status")
    status = ((response.json().get("data") or {}).get("clusterStatus") or {}) if response.status_code == 200 else {}
    by_node = (status.get("loadMetricsReport") or {}).get("usageByNode")
    if not by_node:  # Ray's first usage report comes a few seconds after the head starts: the totals alone
        response = client._do_request("GET", "/api/v0/nodes?detail=1")
        if response.status_code != 200:
            return None
        listed = ((response.json().get("data") or {}).get("result") or {}).get("result") or []
        nodes = [
            Node(total, None)
            for node in listed
            if node.get("state") == "ALIVE"
            for total in [_devices(node.get("resources_total") or {})]
            if total
        ]
        return nodes or None
    nodes = []
    for usage in by_node.values():  # resource -> [used, total]
        total = _devices({key: pair[1] for key, pair in usage.items()})
        if total:
            nodes.append(Node(total, {key: max(0.0, total[key] - float(usage[key][0])) for key in total}))
    return nodes


def _devices(resources: dict) -> dict:
    return {key: float(resources[key]) for key in DEVICES if float(resources.get(key, 0.0)) > 0}
