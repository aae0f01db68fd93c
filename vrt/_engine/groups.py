"""Exception groups at the public doors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def single_unwrapped() -> Iterator[None]:
    """Re-raise a lone exception out of a nursery's ExceptionGroup, as it was raised.

    Our context managers run the caller's body (and our own setup) inside nurseries whose
    background tasks do not raise; a group of one is then the caller's own exception, and
    they should get it back unwrapped (trio-websocket does the same).
    """
    try:
        yield
    except BaseExceptionGroup as group:
        lone: BaseException = group
        while isinstance(lone, BaseExceptionGroup) and len(lone.exceptions) == 1:
            lone = lone.exceptions[0]  # nested nurseries nest their groups of one
        if lone is group:
            raise
        raise lone from None
