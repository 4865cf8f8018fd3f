"""Structured reasons: what a decision rests on or why it is refused, as a code and the numbers behind it; the words
live in rlscale/views/wording.py, and tests assert codes and numbers, never the words."""

from dataclasses import dataclass, field

from rlscale.base.numbers import json_safe


@dataclass(frozen=True)
class Reason:
    """One reason: `code` names what happened (e.g. "law_not_identified"); `values` holds the numbers, run names
    and nested Reasons its text needs (compute in the study's unit, rewards as pass rates)."""

    code: str
    values: dict = field(default_factory=dict)

    def __getitem__(self, key):
        return self.values[key]

    def to_dict(self) -> dict:
        """{"code": ..., "values": {...}}, nested Reasons as dicts; JSON-ready (NaN and inf as None)."""
        return {"code": self.code, "values": json_safe(_plain(self.values))}


def _plain(value):
    if isinstance(value, Reason):
        return value.to_dict()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


class Refusal(Exception):
    """The evidence cannot support a decision; `reasons`: the main one first; str(): the sentence a user reads."""

    def __init__(self, *reasons: Reason):
        super().__init__(*reasons)
        self.reasons = tuple(reasons)

    @property
    def codes(self) -> list[str]:
        """The reasons' codes, main one first."""
        return [reason.code for reason in self.reasons]

    def reason(self, code: str) -> Reason:
        """The reason with `code` (KeyError when there is none)."""
        for reason in self.reasons:
            if reason.code == code:
                return reason
        raise KeyError(code)

    def to_dict(self) -> dict:
        """{"refused": True, "reasons": [Reason.to_dict(), ...]}."""
        return {"refused": True, "reasons": [reason.to_dict() for reason in self.reasons]}

    def __str__(self) -> str:
        return "refused: " + ", ".join(self.codes)  # the words are rlscale.views.wording.refusal_text's
