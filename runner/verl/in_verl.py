"""Run in verl's own environment (compose.py, via jobs_api.env_worker; imports only verl, rlscale is not there): verl's
Hydra composes and validates the commands rlscale would launch, one JSON answer line per request line."""

import json
import os
import sys
import traceback

os.environ["HF_HUB_OFFLINE"] = "1"  # the rehearsal reads no network: a model not in the local cache is a note

import verl  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import MissingMandatoryValue  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

VERL_CONFIG = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
ABSENT = object()


def flags_and_overrides(words: list[str]) -> tuple[str, str, list[str]]:
    """(config folder, config name, overrides) of main_ppo's arguments; a relative folder is verl's own."""
    flags = dict(word[2:].split("=", 1) for word in words if word.startswith("--"))
    folder = flags.get("config-path", VERL_CONFIG)
    folder = folder if os.path.isabs(folder) else os.path.join(os.path.dirname(VERL_CONFIG), folder)
    name = flags.get("config-name", "ppo_trainer").removesuffix(".yaml")
    return folder, name, [word for word in words if not word.startswith("--")]


def plain_key(word: str, folders: tuple[str, ...]) -> str | None:
    """The key of a plain `key=value` override (Hydra refuses it for a key the config lacks); None for +key, ++key,
    ~key, Hydra's own keys and a config group (a folder of configs in `folders`, e.g. verl's model_engine=megatron)."""
    key = word.split("=", 1)[0]
    if word.startswith(("+", "~")) or "=" not in word or key.startswith("hydra."):
        return None
    if "/" in key or any(os.path.isdir(os.path.join(folder, key)) for folder in folders):
        return None
    return key


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and first lines (Hydra's instantiation error names the target on one line
    and the cause on the next; an assertion without text: the failing source line)."""
    text = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if text:
        return f"{type(err).__name__}: {' '.join(text[:2])}"[:400]
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return f"{type(err).__name__} at {os.path.basename(frame.filename)}:{frame.lineno}: {frame.line}"[:400]


def leaves(node, prefix: str = ""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def missing_keys(name: str, overrides: list[str], folders: tuple[str, ...]) -> list[str]:
    """The plain overrides' keys that the config (composed with the other overrides) does not have."""
    keys = {word: plain_key(word, folders) for word in overrides}
    base = compose(config_name=name, overrides=[word for word in overrides if keys[word] is None])
    return [key for key in keys.values() if key and not has(base, key)]


def has(cfg, key: str) -> bool:
    """Whether the config holds `key` (a value still to be given, ???, counts)."""
    try:
        return OmegaConf.select(cfg, key, default=ABSENT, throw_on_missing=True) is not ABSENT
    except MissingMandatoryValue:
        return True


def validate(cfg) -> list[str]:
    """main_ppo's and its trainer's checks at start (notes on what could not run here). The critic's model config is
    read from the model itself: one not in this machine's Hugging Face cache is a note, and the other checks run."""
    notes, critic = [], need_critic(cfg)
    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=critic)
    except Exception as err:
        if not (critic and model_not_here(err)):
            raise
        notes.append(
            f"critic.model.path {cfg.critic.model.path}: not in this machine's Hugging Face cache; verl reads its "
            "config at launch, so the critic's checks did not run here"
        )
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=False)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    OmegaConf.to_container(cfg, resolve=True)
    return notes


def model_not_here(err: BaseException | None) -> bool:
    """Whether `err` (or what caused it) is Hugging Face's hub not finding a model offline."""
    while err is not None:
        if type(err).__module__.startswith("huggingface_hub"):
            return True
        err = err.__cause__ or err.__context__
    return False


def read(command: dict) -> dict:
    folder, name, overrides = flags_and_overrides(command["words"])
    out = {"ok": False, "config": name, "error": "", "missing": [], "keys": None, "notes": []}
    with initialize_config_dir(config_dir=folder, version_base=None):
        try:
            cfg = compose(config_name=name, overrides=overrides)
        except Exception as err:  # Hydra's refusal: name every key it would refuse
            out["error"] = one_line(err)
            try:
                out["missing"] = missing_keys(name, overrides, (folder, VERL_CONFIG))
            except Exception:  # the config itself does not compose: the error says why
                pass
            return out
    try:
        if command.get("validate"):
            out["notes"] = validate(cfg)
    except Exception as err:  # validate_config asserts and raises what it finds
        out["error"] = one_line(err)
        return out
    if command.get("keys"):
        out["keys"] = sorted(leaves(OmegaConf.to_container(cfg, resolve=False)))
    out["ok"] = True
    return out


def serve() -> None:
    """Answer each request line ({"commands": [...]}) with a JSON line until EOF; verl's prints go to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        commands = json.loads(line)["commands"]
        answers.write(json.dumps({"version": verl.__version__, "results": [read(c) for c in commands]}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
