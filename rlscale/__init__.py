"""rlscale: RL post-training as predictable as pre-training; the API (api.py) loads on first use: import stays fast."""

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
