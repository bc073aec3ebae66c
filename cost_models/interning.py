"""One object per distinct job input, so per-job memos survive across requests.

The pricing memos in `cost_models.stage_table` and `cost_models.comm` are keyed by the identity of
the job's model, training, cluster and calibration objects (hashing a pydantic model on every
lookup costs more than the lookup). Two requests for the same job build equal but distinct
objects, and would each start with empty memos. `canonical` maps every value to the first object
seen with it (all four types are frozen and hash and compare by value), so equal inputs share
memos. Memoized results are functions of the values alone, so sharing them changes no number.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

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
