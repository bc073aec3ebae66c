"""Cluster presets (`data/clusters.yaml`) and user cluster files, loaded into `ClusterSpec`.

A cluster is written as a mapping of `ClusterSpec` fields, in vendor units or SI:

```yaml
gpu: H100-80GB                # catalog name or alias, or a mapping (GPUSpec fields in SI, or a
gpus_per_node: 8              #   catalog-style entry with `peak_dense` in vendor units)
nvlink_domain_size: 8         # optional, defaults to gpus_per_node
placement_segment_nodes: 16   # optional: nodes kept in one domain when a job spans domains (Slurm --segment)
intra_node: {kind: nvswitch, bus_bandwidth: 368 GB/s, latency: 1.9 us}
inter_node: {kind: infiniband, nics_per_node: 8, nic_bandwidth: 400 Gb/s, rail_optimized: true,
             oversubscription: 1.0, nodes_per_leaf: 32, latency: 4 us}
host_memory: 2 TiB
host_to_device: 50 GB/s       # per GPU, one direction
host_memory_bandwidth: 614.4 GB/s   # per node: sockets x channels x MT/s x 8 B
cpu_cores: 112                # physical cores per node (they run the CPU optimizer)
nvme: 30.72 TB                # local NVMe per node for offload (TB = 10^12 B, TiB = 2^40 B); 0 B = none
nvme_read: 52 GB/s            # all the node's drives striped, sequential
nvme_write: 24 GB/s
```

Short keys take unit strings (`bus_bandwidth: 368 GB/s`); the SI field names take numbers or unit
strings (`bus_bandwidth_bytes_per_s: 3.68e11`). Rates without a direction are one direction.
`cpu_cores` is a plain number. A node with `nvme` above 0 needs both NVMe bandwidths.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cluster_specs import units
from cluster_specs.catalog import get_gpu, gpu_from_entry, matmul_reference, normalize_name
from cluster_specs.spec import ClusterSpec, GPUSpec

# short key -> (field, parser); a field name given directly goes through the same parser.
_Quantity = tuple[str, Callable[[object], float]]
_INTRA: dict[str, _Quantity] = {
    "bus_bandwidth": ("bus_bandwidth_bytes_per_s", units.bytes_per_s),
    "latency": ("latency_s", units.seconds),
}
_INTER: dict[str, _Quantity] = {
    "nic_bandwidth": ("nic_bandwidth_bytes_per_s", units.bytes_per_s),
    "latency": ("latency_s", units.seconds),
}
_TOP: dict[str, _Quantity] = {
    "host_memory": ("host_memory_bytes", units.n_bytes),
    "host_to_device": ("host_to_device_bytes_per_s", units.bytes_per_s),
    "host_memory_bandwidth": ("host_memory_bandwidth_bytes_per_s", units.bytes_per_s),
    "nvme": ("nvme_bytes", units.n_bytes),
    "nvme_read": ("nvme_read_bytes_per_s", units.bytes_per_s),
    "nvme_write": ("nvme_write_bytes_per_s", units.bytes_per_s),
}


def _convert(data: Mapping[str, Any], quantities: dict[str, _Quantity]) -> dict[str, Any]:
    by_field = {field: parse for field, parse in quantities.values()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        field, parse = quantities.get(key, (key, by_field.get(key)))
        if field in out:
            raise ValueError(f"{key!r} given twice (as {field!r})")
        out[field] = parse(value) if parse else value
    return out


def _gpu(value: Any) -> GPUSpec:
    if isinstance(value, GPUSpec):
        return value
    if isinstance(value, str):
        return get_gpu(value)
    if isinstance(value, Mapping):
        if "peak_dense" in value:  # catalog style, vendor units
            entry = dict(value)
            return gpu_from_entry(str(entry.pop("name", "custom")), entry, matmul_reference())
        return GPUSpec(**value)
    raise TypeError(f"gpu must be a catalog name, a mapping or a GPUSpec, not {type(value).__name__}")


def cluster_from_dict(data: Mapping[str, Any], name: str | None = None) -> ClusterSpec:
    """Build a `ClusterSpec` from a mapping of its fields (see the module docstring). With a
    `preset` key, the named preset's fields are the defaults and the other keys override them
    (`intra_node` / `inter_node` merged key by key): `{"preset": "dgx-a100-80g", "host_memory":
    "64 GiB"}` is a DGX A100 whose nodes have 64 GiB of host memory, named `<preset>-custom`
    unless a `name` is given."""
    if "preset" in data:
        data, name = _over_preset(data, name)
    fields = _convert(data, _TOP)
    if "gpu" not in fields:
        raise ValueError("a cluster needs a 'gpu'")
    fields["gpu"] = _gpu(fields["gpu"])
    if "intra_node" in fields:
        fields["intra_node"] = _convert(fields["intra_node"], _INTRA)
    if "inter_node" in fields:
        fields["inter_node"] = _convert(fields["inter_node"], _INTER)
    if name is not None:
        fields["name"] = name
    return ClusterSpec(**fields)


def _over_preset(data: Mapping[str, Any], name: str | None) -> tuple[dict[str, Any], str]:
    """The fields of `data["preset"]` with the rest of `data` over them, compared on field names
    (a short key such as `host_memory` overrides the field `host_memory_bytes`), and the name."""
    preset = data["preset"]
    if not isinstance(preset, str):
        raise ValueError(f"preset: expected a cluster preset name, got {type(preset).__name__}")
    key = normalize_name(preset)
    raw = _raw_presets()
    if key not in raw:
        raise ValueError(f"preset: unknown cluster preset {preset!r}; known: {', '.join(raw)}")
    base = _convert(raw[key], _TOP)
    over = _convert({k: v for k, v in data.items() if k not in ("preset", "name")}, _TOP)
    for sub, quantities in (("intra_node", _INTRA), ("inter_node", _INTER)):
        if isinstance(over.get(sub), Mapping) and isinstance(base.get(sub), Mapping):
            over[sub] = {**_convert(base[sub], quantities), **_convert(over[sub], quantities)}
    given = data.get("name")
    merged = {**base, **over}
    if over and "source" not in over:
        merged["source"] = f"preset {key} ({base.get('source', '')}); the request overrides {', '.join(sorted(over))}"
    return merged, name or (given if isinstance(given, str) else f"{key}-custom")


def load_cluster_yaml(path: str | Path) -> ClusterSpec:
    """A user cluster file: one mapping as above (its `name` defaults to the file's stem)."""
    path = Path(path)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping of cluster fields")
    return cluster_from_dict(data, name=data.get("name", path.stem))


@functools.cache
def _raw_presets() -> dict[str, dict[str, Any]]:
    raw = yaml.safe_load(resources.files("cluster_specs").joinpath("data/clusters.yaml").read_text())
    return dict(raw["clusters"])


@functools.cache
def _presets() -> dict[str, ClusterSpec]:
    return {key: cluster_from_dict(entry, name=key) for key, entry in _raw_presets().items()}


def preset_entry(name: str) -> tuple[str, dict[str, Any]]:
    """(canonical name, the preset's entry in data/clusters.yaml with YAML anchors expanded):
    vendor units as written there, ready to save as a user cluster file."""
    import copy

    get_cluster(name)  # KeyError with the known names
    key = normalize_name(name)
    return key, copy.deepcopy(_raw_presets()[key])


def list_clusters() -> list[str]:
    """Preset names."""
    return list(_presets())


def get_cluster(name: str) -> ClusterSpec:
    """The preset called `name` (any case; spaces and underscores read as dashes)."""
    presets = _presets()
    key = normalize_name(name)
    if key not in presets:
        raise KeyError(f"unknown cluster preset {name!r}; known: {', '.join(presets)}")
    return presets[key]
