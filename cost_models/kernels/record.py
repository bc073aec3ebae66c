"""Which atlas entries a pricing looks up: a recorder the atlas's lookups report to while one is open.

`recording()` opens a `Lookups` that collects, until the block ends, every kernel the atlas is
asked about: GEMMs by (m, n, k, dtype class), attention by (kernel, head dim, length, mask, pass),
collectives by (op of the size curve, span, ranks, nodes, buffer bytes). What a plan needs measured
(`autopar profile`, `cost_models.kernel_needs`) is what its pricing looks up, never a second list
kept by hand. With no recorder open, each lookup pays one test of an empty list.

Keys use the atlas file's vocabulary (`cost_models.kernels.schema`): a 16-bit GEMM table is recorded
as ``bf16`` (fp16 and TF32 GEMMs read the same table), an FP8 one as ``fp8``; an attention lookup
names the first kernel of the stack's preference list (`cost_models.compute.FUSED_ATTENTION`,
`FLASH2_ATTENTION`), the one a measurement on the user's GPU should time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GemmKey = tuple[int, int, int, str]
AttentionKey = tuple[str, int, int, bool, str]
CollectiveKey = tuple[str, str, int, int, int]

DTYPE_OF_CLASS = {"16": "bf16", "fp8": "fp8"}


@dataclass
class Lookups:
    """Distinct atlas lookups of one recording (module doc)."""

    gemm: set[GemmKey] = field(default_factory=set)
    attention: set[AttentionKey] = field(default_factory=set)
    collectives: set[CollectiveKey] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.gemm) + len(self.attention) + len(self.collectives)


ACTIVE: list[Lookups] = []
"""The open recorders (innermost last); every one of them receives each lookup."""


@contextmanager
def recording() -> Iterator[Lookups]:
    """Collect the atlas lookups made inside the block (module doc)."""
    rec = Lookups()
    ACTIVE.append(rec)
    try:
        yield rec
    finally:
        ACTIVE.remove(rec)


def _ints(x: Any) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=float)).astype(np.int64).ravel()


def gemm(cls: str, m: Any, n: Any, k: Any) -> None:
    """A GEMM table of dtype class `cls` ("16", "fp8") priced shapes (m, n, k) (scalars or arrays)."""
    ms, ns, ks = np.broadcast_arrays(_ints(m), _ints(n), _ints(k))
    dtype = DTYPE_OF_CLASS.get(cls, "bf16")
    keys = {(int(a), int(b), int(c), dtype) for a, b, c in zip(ms.tolist(), ns.tolist(), ks.tolist(), strict=True)
            if a > 0 and b > 0 and c > 0}
    for rec in ACTIVE:
        rec.gemm |= keys


def attention(kernels: tuple[str, ...], seq: Any, head_dim: int, causal: bool, pass_: str) -> None:
    """An attention rate looked up at `seq` queries (= keys), scalar or array."""
    keys = {(kernels[0], int(head_dim), int(s), bool(causal), pass_) for s in set(_ints(seq).tolist()) if s > 0}
    for rec in ACTIVE:
        rec.attention |= keys


def collective(op: str, span: str, ranks: int, nodes: int, nbytes: Any) -> None:
    """A collective size curve (op, span, ranks, nodes) read at buffers of `nbytes` (scalar or array)."""
    keys = {(op, span, int(ranks), int(nodes), int(b)) for b in set(_ints(nbytes).tolist()) if b > 0}
    for rec in ACTIVE:
        rec.collectives |= keys
