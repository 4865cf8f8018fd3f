"""verl's own Hydra, in verl's environment (in_verl.py via jobs_api.env_worker), reads the user's command (its keys
are the only ones rlscale sets) and composes and validates each job's command as main_ppo does at its start."""

import threading
from dataclasses import dataclass, field
from pathlib import Path

from rlscale.runner.jobs_api import EnvironmentFailed, env_worker, framework_python

from rlscale.base.errors import UserError

IN_VERL = Path(__file__).with_name("in_verl.py")
NO_VERL = (
    "verl's Hydra composes each job's command before anything runs, and this machine has no verl environment: "
    "build it (scripts/checker_envs.sh verl) or set RLSCALE_VERL_PYTHON to a Python with verl 0.9.1"
)


@dataclass(frozen=True)
class Composed:
    """One command as verl read it: `config` composed; ok, or `error` (verl's one-line reason) and `missing` (override
    keys the config lacks); `keys` the config's dotted keys when asked for; `notes` on checks not run here."""

    ok: bool
    config: str
    error: str = ""
    missing: tuple[str, ...] = ()
    keys: frozenset = field(default_factory=frozenset)
    notes: tuple[str, ...] = ()  # what verl could not check here (a model not in this machine's cache)


def verl_python() -> Path:
    """verl's environment on this machine (jobs_api.framework_python); UserError saying how to get one."""
    python = framework_python("verl")
    if python is None or not python.exists():
        raise UserError(NO_VERL, field="engine")
    return python


def compose(commands: list[list[str]], *, keys: bool = False, validate: bool = True) -> tuple[str, list[Composed]]:
    """(verl's version, each command as verl read it), validated as main_ppo does when `validate`, with its keys when
    `keys`. UserError without a verl environment; RuntimeError when verl itself fails there."""
    payload = {"commands": [{"words": words, "keys": keys, "validate": validate} for words in commands]}
    try:
        out = env_worker(verl_python(), IN_VERL).ask(payload)
    except EnvironmentFailed as err:
        raise RuntimeError(f"verl's environment could not read the commands: {err}") from None
    results = [
        Composed(
            ok=result["ok"],
            config=result["config"],
            error=result["error"],
            missing=tuple(result["missing"]),
            keys=frozenset(result["keys"] or ()),
            notes=tuple(result["notes"]),
        )
        for result in out["results"]
    ]
    return out["version"], results


_users: dict[tuple, tuple[str, Composed]] = {}  # a user's command -> how verl composed it (one reading a process)
_users_lock = threading.Lock()


def user_config(words: list[str], files: list[str]) -> tuple[str, Composed]:
    """(verl's version, the user's own command composed with its keys), read once per process for the same words
    and files (`files`: the user's files, whose contents the composition depends on)."""
    stamp = tuple((path, Path(path).stat().st_mtime_ns) for path in files if Path(path).is_file())
    key = (tuple(words), stamp)
    with _users_lock:
        if key not in _users:
            version, (composed,) = compose([words], keys=True, validate=False)
            _users[key] = (version, composed)
        return _users[key]
