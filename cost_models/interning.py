"""One object per distinct job input, so per-job memos survive across requests; and the memo
those pricing memos are made of (`KeptMemo`).

The pricing memos (`KeptMemo`s in `cost_models.stage_table`, `step_time`, `comm`, `mesh_comm`,
`compute`, `report`, `kernels.atlas`) are keyed by the identity of the job's model, training,
cluster, calibration and GPU objects (hashing a pydantic model on every lookup costs more than the
lookup). Two requests for the same job build equal but distinct objects, and would each start with
empty memos. `canonical` maps every value to the first object seen with it (the job's four types
are frozen and hash and compare by value), so equal inputs share memos. Memoized results are
functions of the values alone, so sharing them changes no number.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")
V = TypeVar("V")

_CANONICAL: dict[object, object] = {}
MAX_ENTRIES = 256
"""Distinct inputs kept; the table starts over beyond this (the memos then simply miss)."""


def canonical(obj: T) -> T:
    """The first object seen equal to `obj` (itself when it is new, or when it cannot be hashed)."""
    try:
        hit = _CANONICAL.get(obj)
    except TypeError:  # unhashable (e.g. a mutable field): no sharing, nothing else changes
        return obj
    if hit is not None and type(hit) is type(obj):
        return hit  # type: ignore[return-value]
    if len(_CANONICAL) >= MAX_ENTRIES:
        _CANONICAL.clear()
    _CANONICAL[obj] = obj
    return obj


class KeptMemo(Generic[V]):
    """A bounded memo of results that are functions of their key's values, where a key may name job
    objects by `id()` (hashing a pydantic model on every lookup costs more than the lookup). Each
    entry keeps the objects its key names alive (`put`'s `keep`): while it exists no other object
    can take their ids, so a hit needs no identity check. An entry is one (keep, value) tuple, put
    and dropped at once, so a search in another thread (`api.planning` plans in worker threads)
    never finds a value whose kept objects are gone. At `limit` entries it starts over: the memo
    then simply misses. Values are never None (`get`'s miss)."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int) -> None:
        self._entries: dict[Hashable, tuple[object, V]] = {}
        self.limit = limit

    def get(self, key: Hashable) -> V | None:
        hit = self._entries.get(key)
        return None if hit is None else hit[1]

    def put(self, key: Hashable, keep: object, value: V) -> V:
        """Keep `value` under `key`, and with it `keep` (the objects whose ids the key holds, or None);
        returns `value`."""
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = (keep, value)
        return value

    def values(self) -> list[V]:
        return [value for _, value in list(self._entries.values())]

    def __iter__(self) -> Iterator[Hashable]:
        """The keys."""
        return iter(list(self._entries))

    def items(self) -> list[tuple[Hashable, object, V]]:
        """(key, what the entry keeps, value) of every entry."""
        return [(key, keep, value) for key, (keep, value) in list(self._entries.items())]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
