"""A set that keeps only its most recent members: per-session bookkeeping with a bound."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class RecentSet(Generic[T]):
    """The last ``limit`` distinct members added (oldest forgotten first).

    For what a session remembers of every call (ids seen, results answered): without a
    bound a session that goes on for days grows by each call; the oldest calls are the
    ones nobody refers to again.
    """

    __slots__ = ("_items", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: dict[T, None] = {}

    def add(self, item: T) -> None:
        """Remember ``item`` (as the newest)."""
        items = self._items
        items.pop(item, None)
        items[item] = None
        if len(items) > self.limit:
            del items[next(iter(items))]

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)
