"""rlscale: make RL post-training as predictable as pre-training.
rlscale.fit, predict, decide, decision_text and plot (rlscale/api.py) load on first use: `import rlscale` stays fast."""

__version__ = "0.1.0"
API = ("decide", "decision_text", "fit", "plot", "predict")
__all__ = [*API, "__version__"]


def __getattr__(name: str):
    if name in API:
        from rlscale import api

        return getattr(api, name)
    raise AttributeError(f"module 'rlscale' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
