"""The history a model step sees, as an O(1) snapshot of an append-only list."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

T = TypeVar("T")


class Snapshot(Sequence[T]):
    """The first ``len`` items of a list that only ever grows: the history as it was.

    Why: copying the whole history into every model request made a session's cost grow
    with the square of its length. The session never changes or removes an item, so a
    prefix of its list is as immutable as a tuple.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[T]) -> None:
        self._items = items
        self._n = len(items)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...
    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        if isinstance(index, slice):
            if index.step is None or index.step == 1:  # no copy of the whole prefix
                start, stop, _ = index.indices(self._n)
                return tuple(self._items[start:stop])
            return tuple(self._items[: self._n][index])
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[T]:
        items = self._items
        for i in range(self._n):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Snapshot({list(self)!r})"
