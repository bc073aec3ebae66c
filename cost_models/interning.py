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
    can take their ids, so a hit needs no identity check. At `limit` entries it starts over: the
    memo then simply misses. Values are never None (`get`'s miss). The values and what they keep
    are held in two dicts of the same keys (no tuple per entry for the cyclic collector to walk)."""

    __slots__ = ("_values", "_kept", "limit")

    def __init__(self, limit: int) -> None:
        self._values: dict[Hashable, V] = {}
        self._kept: dict[Hashable, object] = {}
        self.limit = limit

    def get(self, key: Hashable) -> V | None:
        return self._values.get(key)

    def put(self, key: Hashable, keep: object, value: V) -> V:
        """Keep `value` under `key`, and with it `keep` (the objects whose ids the key holds, or None);
        returns `value`."""
        if len(self._values) >= self.limit:
            self.clear()
        self._kept[key] = keep
        self._values[key] = value
        return value

    def values(self) -> list[V]:
        return list(self._values.values())

    def __iter__(self) -> Iterator[Hashable]:
        """The keys."""
        return iter(list(self._values))

    def items(self) -> list[tuple[Hashable, object, V]]:
        """(key, what the entry keeps, value) of every entry."""
        return [(key, self._kept[key], value) for key, value in self._values.items()]

    def clear(self) -> None:
        self._values.clear()
        self._kept.clear()

    def __len__(self) -> int:
        return len(self._values)
