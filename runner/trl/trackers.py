"""What a TRL job's report_to asks of rlscale: which trackers' env to set (rlscale.runner.tracking.tracker_env) and
trackio's project; runs grouped by study, named by run key."""


def trackers(report_to) -> set[str]:
    """The tracker names of a report_to value ("all" stands for every installed one)."""
    if report_to in (None, "none"):
        return set()
    names = {report_to} if isinstance(report_to, str) else set(report_to)
    return names - {"none"}


def uses(report_to, tracker: str) -> bool:
    names = trackers(report_to)
    return tracker in names or "all" in names


def env_backends(report_to) -> list[str]:
    """The trackers of report_to that the job's env groups, names and resumes (rlscale.runner.tracking.tracker_env)."""
    return [name for name in ("mlflow", "wandb") if uses(report_to, name)]


def tracker_keys(report_to, *, study: str) -> dict:
    """GRPOConfig keys that group the runs: trackio's project."""
    return {"project": study} if uses(report_to, "trackio") else {}
