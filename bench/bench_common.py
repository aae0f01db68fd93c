"""What the benchmark scripts share (they run as ``python bench/NAME.py``, which puts this
directory on ``sys.path``)."""

from __future__ import annotations

from importlib import metadata


def version(name: str) -> str:
    """The installed version of distribution ``name``, or ``?``."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"
