"""The DeviceMesh of a layout: named dimensions and the sub-meshes each parallelism uses.

World mesh dimensions are `pp`, `dp_replicate`, `dp_shard`, `cp` and `tp` (sizes may be 1), laid
out so that global ranks follow `layout.order` exactly as `cost_models.mesh.mesh_strides` prices
them: the order string lists dimensions fastest-varying first (Megatron-Core's `tp-cp-ep-dp-pp`:
TP ranks consecutive, PP furthest apart). `dp` is split into `dp_replicate x dp_shard` with the
shard group innermost, so a hybrid-sharding (HSDP) shard group is `dp_shard` neighbouring DP ranks.

Derived (flattened / unflattened) meshes, all sharing the world mesh as root so DTensor and FSDP2
can combine them:
- `dp_shard_cp` = dp_shard x cp: FSDP shards dense weights over it (CP ranks hold the same weights
  and must reduce their gradients too; torchtitan does the same). `fsdp` is this 1D mesh, or the 2D
  (`dp_replicate`, `dp_shard_cp`) mesh for HSDP.
- `dp_cp` = dp x cp: every rank holding a copy of the dense weights; the loss is averaged over it.
- Expert parallelism is carved out of dp x cp (Megatron-Core): `dp_cp` is unflattened into
  (`edp`, `ep`), `ep` innermost, so an EP group is `ep` consecutive ranks of the flattened (dp, cp)
  sub-grid in the order the two appear in `layout.order`. Expert weights are sharded over `ep` and
  FSDP-sharded over `edp` (expert data parallel): on the expert dim when the E/ep local experts
  divide over `edp`, else on dim 1 (`runtime.parallelize._expert_shard_placement`).

The world mesh is only built when the world has more than one rank; `Meshes.single()` stands for a
one-process run with no process group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cost_models.layout import Layout

__all__ = ["Meshes", "build_meshes", "world_dims"]


def world_dims(layout: Layout) -> list[tuple[str, int]]:
    """(name, size) of the world mesh dimensions, outermost first, following `layout.order`."""
    sizes = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp}
    inner_first = [d for d in layout.order.split("-") if d != "ep"]
    dims: list[tuple[str, int]] = []
    for d in reversed(inner_first):
        if d == "dp":
            dims.append(("dp_replicate", layout.dp_ // layout.dp_shard_))
            dims.append(("dp_shard", layout.dp_shard_))
        else:
            dims.append((d, sizes[d]))
    return dims


@dataclass
class Meshes:
    """Sub-meshes of one layout for this rank. Every mesh is None in a single-process run."""

    layout: Layout
    world: DeviceMesh | None
    _cache: dict[str, DeviceMesh] = field(default_factory=dict)

    @classmethod
    def single(cls, layout: Layout) -> Meshes:
        return cls(layout, None)

    # ---- coordinates ---------------------------------------------------------------------------
    def _local(self, name: str) -> int:
        if self.world is None:
            return 0
        return self[name].get_local_rank()

    @property
    def pp_rank(self) -> int:
        return self._local("pp")

    @property
    def tp_rank(self) -> int:
        return self._local("tp")

    @property
    def cp_rank(self) -> int:
        return self._local("cp")

    @property
    def dp_rank(self) -> int:
        """Rank within the data-parallel group (0..dp-1): which slice of the global batch."""
        return self._local("dp_replicate") * self.layout.dp_shard_ + self._local("dp_shard")

    @property
    def ep_rank(self) -> int:
        return self._local("ep") if self.layout.ep > 1 else 0

    # ---- meshes --------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> DeviceMesh:
        assert self.world is not None, "no mesh in a single-process run"
        if name in self._cache:
            return self._cache[name]
        names = self.world.mesh_dim_names or ()
        if name in names:
            mesh = self.world[name]
        elif name in ("dp_shard_cp", "dp_cp", "dp"):
            want = {"dp_shard_cp": ("dp_shard", "cp"), "dp_cp": ("dp_replicate", "dp_shard", "cp"),
                    "dp": ("dp_replicate", "dp_shard")}[name]
            mesh = self.world[tuple(n for n in names if n in want)]._flatten(name)
        elif name in ("ep", "edp"):
            lay = self.layout
            experts = self["dp_cp"]._unflatten(0, (lay.dp_ * lay.cp // lay.ep, lay.ep), ("edp", "ep"))
            self._cache["ep"], self._cache["edp"] = experts["ep"], experts["edp"]
            return self._cache[name]
        else:
            raise KeyError(name)
        self._cache[name] = mesh
        return mesh

    def get(self, name: str) -> DeviceMesh | None:
        """The 1D mesh `name`, or None when the run is single-process or that dimension has size 1."""
        if self.world is None:
            return None
        mesh = self[name]
        return mesh if mesh.size() > 1 else None

    @property
    def fsdp(self) -> DeviceMesh | None:
        """Mesh FSDP2 shards dense weights over: 1D `dp_shard_cp`, 2D (`dp_replicate`,
        `dp_shard_cp`) for HSDP; None when dp x cp = 1."""
        lay = self.layout
        if self.world is None or lay.dp_ * lay.cp == 1:
            return None
        if lay.dp_shard_ == lay.dp_:
            return self["dp_shard_cp"]
        if "hsdp" not in self._cache:
            # Concatenating keeps the root (and reuses both groups) without slicing a flattened
            # dim from the root, which torch deprecates.
            self._cache["hsdp"] = DeviceMesh._concatenate([self.world["dp_replicate"], self["dp_shard_cp"]])
        return self._cache["hsdp"]

    @property
    def expert_fsdp(self) -> DeviceMesh | None:
        """Mesh FSDP2 shards expert weights over (`edp`); None when there is no data parallelism."""
        lay = self.layout
        if self.world is None or lay.dp_ * lay.cp == 1:
            return None
        return self["edp"]


def build_meshes(layout: Layout, device_type: str = "cpu") -> Meshes:
    """Meshes of `layout` for this process. Needs an initialised process group of
    `layout.world_size` ranks, unless the world is one rank (then none is needed)."""
    world = layout.world_size
    if world == 1 and not (dist.is_available() and dist.is_initialized()):
        return Meshes.single(layout)
    if dist.get_world_size() != world:
        raise ValueError(f"the layout needs {world} ranks; the process group has {dist.get_world_size()}")
    dims = world_dims(layout)
    mesh = init_device_mesh(device_type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))
    return Meshes(layout, mesh)
