"""Initial weights that do not depend on the layout: each parameter's values come from a seed and
the parameter's global name, generated tile by tile, so a rank materialises only its shard.

The runtime builds every model on the meta device, cuts and shards it there (pipeline chunks,
DTensor tensor / expert parallel, FSDP2), then gives each rank's chunks storage with `to_empty`
and fills only the local shards (torchtitan's habit: `to_empty(device)` then `init_weights()`
under `no_grad`, per model part). For the shards of one parameter to equal the slices of the
single-process tensor, the values of an element cannot depend on which rank generates it or in
what order. `SeededInit` therefore draws every parameter as a grid of fixed tiles:

- the parameter is viewed as a matrix (rows = dim 0, columns = the other dims flattened; a 1-D
  parameter is one row);
- the matrix is cut into tiles of `TILE_ROWS x TILE_COLS` elements (the last tiles of a row or a
  column band are smaller; their size is fixed by the global shape);
- tile (i, j) is drawn whole from a `torch.Generator` seeded by (run seed, parameter name, i, j);
- a rank draws the tiles its shard touches and copies their intersection with the shard.

Every sharding the runtime uses keeps a shard a box of that matrix: FSDP2 and column-parallel TP
shard dim 0 (contiguous rows, `_StridedShard` included), row-parallel TP shards dim 1 of an
(out, in) weight (a column band), expert parallelism dim 0 and FSDP's expert fallback dim 1 of an
(E, width, h) tensor (a column band of its matrix). A shard that is not a box (a sharded dim >= 2)
is drawn as the whole matrix and sliced: correct, only slower.

A rank's work is its shard plus at most the tiles cut by its edges. Values depend on the seed, the
name and the device kind (CPU: mt19937, CUDA: Philox; the tile size is per device kind, below),
never on the layout. Elementwise transforms of a drawn tensor (a log-uniform dt) stay layout-free.

A QLoRA base weight (an NF4 tensor, `runtime.quantize`) is drawn whole in its 16-bit dtype and
quantized into place, one weight at a time.

A parameter's global name is its name in the whole model (`layers.7.attention.wq.weight`): a
pipeline chunk keeps the global layer keys, and wrappers' prefixes
(`_checkpoint_wrapped_module.`) are removed (`global_names`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn

from runtime.quantize import is_quantized, store_

__all__ = ["TILE", "SeededInit", "global_names", "is_symbolic", "local_box"]

TILE: dict[str, tuple[int, int]] = {"cpu": (8, 2048), "cuda": (64, 8192)}
"""Tile (rows, columns) per device kind. CPU: 16 Ki elements, drawn at 4-10 ns per element with
the generator's seeding (about 7 us a tile) included, on the 2-core CI machine (torch 2.13); CUDA:
512 Ki elements, so an 8 B-parameter shard is ~16 k kernel launches rather than ~500 k."""

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
_MASK63 = (1 << 63) - 1


def _strip(name: str) -> str:
    for p in _WRAPPER_PREFIXES:
        name = name.replace(p, "")
    return name


def global_names(modules: Iterable[nn.Module]) -> dict[int, str]:
    """id(parameter or buffer) -> its global name in `modules` (pipeline chunks keep global
    layer keys; wrapper prefixes removed). Tied parameters keep the first name."""
    out: dict[int, str] = {}
    for m in modules:
        for n, p in m.named_parameters(remove_duplicate=True):
            out.setdefault(id(p), _strip(n))
        for n, b in m.named_buffers(remove_duplicate=True):
            out.setdefault(id(b), _strip(n))
    return out


def local_box(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor, global shape, global offset of the local tensor per dim) of a tensor or
    DTensor. The local tensor covers [offset, offset + local shape) of every dim."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local = t.to_local()
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        if tuple(shape) != tuple(local.shape):
            raise RuntimeError(f"DTensor local shape {tuple(local.shape)} differs from its placement's {tuple(shape)}")
        return local, tuple(t.shape), tuple(int(o) for o in offset)
    return t, tuple(t.shape), (0,) * t.dim()


def _matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return shape[0], math.prod(shape[1:])


def _matrix_box(
    gshape: tuple[int, ...], lshape: tuple[int, ...], offset: tuple[int, ...]
) -> tuple[int, int, int, int] | None:
    """(row0, rows, col0, cols) of the local tensor in the global matrix, or None if not a box."""
    if len(gshape) <= 1:
        n = gshape[0] if gshape else 1
        return 0, 1, (offset[0] if gshape else 0), (lshape[0] if gshape else n)
    if any(offset[d] != 0 or lshape[d] != gshape[d] for d in range(2, len(gshape))):
        return None
    inner = math.prod(gshape[2:])
    return offset[0], lshape[0], offset[1] * inner, lshape[1] * inner


def is_symbolic(t: torch.Tensor) -> bool:
    """True for meta and fake (FakeTensorMode) tensors, which hold no values."""
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


class SeededInit:
    """Fills parameters (tensors or DTensors) by global name and seed (module doc).

    `names`: id(tensor) -> global name (`global_names`). Fake and meta tensors are left alone
    (memory tracing has no values to fill). Every method runs under `torch.no_grad()`."""

    def __init__(self, seed: int, names: Mapping[int, str]) -> None:
        self.seed = int(seed)
        self.names = names

    @classmethod
    def of(cls, module: nn.Module, seed: int = 0) -> SeededInit:
        """An initializer for `module` alone, names relative to it."""
        return cls(seed, global_names([module]))

    def name(self, t: torch.Tensor) -> str:
        try:
            return self.names[id(t)]
        except KeyError:
            raise KeyError(f"a tensor of shape {tuple(t.shape)} has no global name in this initializer") from None

    # ---- fills -------------------------------------------------------------------------------------
    def normal_(self, t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        self._draw(t, lambda buf, g: buf.normal_(mean, std, generator=g))

    def uniform_(self, t: torch.Tensor, low: float, high: float) -> None:
        self._draw(t, lambda buf, g: buf.uniform_(low, high, generator=g))

    @torch.no_grad()
    def constant_(self, t: torch.Tensor, value: float) -> None:
        local, _, _ = local_box(t)
        if not is_symbolic(local):
            local.fill_(value)

    def zeros_(self, t: torch.Tensor) -> None:
        self.constant_(t, 0.0)

    def ones_(self, t: torch.Tensor) -> None:
        self.constant_(t, 1.0)

    @torch.no_grad()
    def values_(self, t: torch.Tensor, full: torch.Tensor) -> None:
        """Copy the slice of `full` (the whole tensor's values: small, computed by the caller)
        that this shard covers."""
        local, gshape, offset = local_box(t)
        if is_symbolic(local):
            return
        if tuple(full.shape) != gshape:
            raise ValueError(f"values of shape {tuple(full.shape)} for {self.name(t)} of shape {gshape}")
        idx = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
        local.copy_(full[idx])

    @torch.no_grad()
    def transform_(self, t: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply the elementwise `fn` to the shard in place (layout-free: one element at a time)."""
        local, _, _ = local_box(t)
        if not is_symbolic(local):
            local.copy_(fn(local))

    # ---- tiles ---------------------------------------------------------------------------------------
    def _key(self, name: str) -> int:
        digest = hashlib.blake2b(f"{self.seed}\x00{name}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    @staticmethod
    def _tile_seed(key: int, i: int, j: int) -> int:
        """splitmix64 of (key, tile row, tile column): independent streams per tile."""
        z = (key + 0x9E3779B97F4A7C15 * (1 + i * 0x100000001B3 + j)) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return (z ^ (z >> 31)) & _MASK63

    @torch.no_grad()
    def _draw(self, t: torch.Tensor, fill: Callable[[torch.Tensor, torch.Generator], object]) -> None:
        local, gshape, offset = local_box(t)
        if is_symbolic(local) or local.numel() == 0:
            return
        key = self._key(self.name(t))
        device = local.device
        tr, tc = TILE["cuda" if device.type == "cuda" else "cpu"]
        rows, cols = _matrix(gshape)
        if is_quantized(local):  # a QLoRA base weight (never sharded): draw it whole, then quantize it
            plain = torch.empty(gshape, dtype=local.dtype, device=device)
            self._fill_box(plain.view(rows, cols), (0, rows, 0, cols), rows, cols, tr, tc, key, fill)
            store_(local, plain)
            return
        box = _matrix_box(gshape, tuple(local.shape), offset)
        if box is None or not local.is_contiguous():
            # not a box of the matrix: draw the whole matrix, then take the shard's slice
            whole = torch.empty(gshape, dtype=local.dtype, device=device)
            self._fill_box(whole.view(rows, cols), (0, rows, 0, cols), rows, cols, tr, tc, key, fill)
            idx = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
            local.copy_(whole[idx])
            return
        r0, nr, c0, nc = box
        self._fill_box(local.view(nr, nc), box, rows, cols, tr, tc, key, fill)

    @staticmethod
    def _fill_box(dest, box, rows, cols, tr, tc, key, fill) -> None:  # type: ignore[no-untyped-def]
        """Fill `dest` (the box (r0, nr, c0, nc) of the rows x cols matrix) tile by tile."""
        r0, nr, c0, nc = box
        device = dest.device
        gen = torch.Generator(device=device)
        buf = torch.empty(tr * tc, dtype=torch.float32, device=device)
        for i in range(r0 // tr, (r0 + nr - 1) // tr + 1):
            t_r0, t_r1 = i * tr, min((i + 1) * tr, rows)
            a0, a1 = max(t_r0, r0), min(t_r1, r0 + nr)
            for j in range(c0 // tc, (c0 + nc - 1) // tc + 1):
                t_c0, t_c1 = j * tc, min((j + 1) * tc, cols)
                b0, b1 = max(t_c0, c0), min(t_c1, c0 + nc)
                gen.manual_seed(SeededInit._tile_seed(key, i, j))
                tile = buf[: (t_r1 - t_r0) * (t_c1 - t_c0)]
                fill(tile, gen)
                tile2 = tile.view(t_r1 - t_r0, t_c1 - t_c0)
                dest[a0 - r0 : a1 - r0, b0 - c0 : b1 - c0].copy_(tile2[a0 - t_r0 : a1 - t_r0, b0 - t_c0 : b1 - t_c0])
