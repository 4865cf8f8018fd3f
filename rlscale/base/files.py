"""Files other processes read while they are written: each write is whole or absent."""

from pathlib import Path


def write_whole(path: Path, text: str) -> Path:
    """Write `text` to `path` so that a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
    return path
