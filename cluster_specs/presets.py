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
_Quantity = tuple[str, Callable[[object], Any]]
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


UNITS_ACCEPTED: dict[Callable[[object], Any], str] = {
    units.n_bytes: "B, kB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)",
    units.bytes_per_s: "Gb/s, Mb/s, Tb/s (bits) or MB/s, GB/s, TB/s, GiB/s (bytes), one direction",
    units.seconds: "s, ms, us, ns",
    units.watts: "W, kW",
    units.flops_per_s: "TFLOPS, PFLOPS, GFLOPS",
}
"""The units a short (vendor-unit) key takes, named when a value comes without one."""


class MissingUnitError(ValueError):
    """A short (vendor-unit) key given a bare number. `path`: the keys from the cluster mapping's top
    down to the offending one, as the user wrote them (the API's 422 `loc` extends its own with it)."""

    def __init__(self, message: str, path: tuple[str, ...]):
        super().__init__(message)
        self.path = path


def _with_unit(key: str, field: str, parse: Callable[[object], Any], value: object, where: str = "") -> Any:
    """`parse(value)` for a short key, which must carry its unit: a bare number other than 0 is refused
    (512 could be bytes or GiB), naming the field, the units it takes and the SI field that takes plain
    numbers. `where`: the keys above it, dotted ("intra_node.")."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value != 0:
        raise MissingUnitError(
            f"{where}{key}: {value!r} has no unit; write it with one, e.g. '{value} {_EXAMPLE_UNIT.get(parse, 'GB')}' "
            f"(units: {UNITS_ACCEPTED.get(parse, 'see README, Cluster files')}), or give {field} as a plain number "
            "in SI units",
            tuple(f"{where}{key}".split(".")),
        )
    return parse(value)


_EXAMPLE_UNIT: dict[Callable[[object], Any], str] = {
    units.n_bytes: "GiB", units.bytes_per_s: "GB/s", units.seconds: "us", units.watts: "W", units.flops_per_s: "TFLOPS",
}


def _convert(
    data: Mapping[str, Any], quantities: dict[str, _Quantity], where: str = "",
    si: Mapping[str, Callable[[Any], Any]] | None = None,
) -> dict[str, Any]:
    """Short keys (vendor units, unit required) and SI field names (numbers, or unit strings read by
    `si`'s parser; default: the short key's) to the fields of a spec."""
    by_field = dict(si) if si is not None else {field: parse for field, parse in quantities.values()}
    out: dict[str, Any] = {}
    for key, value in data.items():
        field, parse = quantities.get(key, (key, by_field.get(key)))
        if field in out:
            raise ValueError(f"{where}{key!r} given twice (as {field!r})")
        if parse is None or value is None:  # None: an optional field left unset (a dumped spec writes it)
            out[field] = value
        elif key in quantities:  # a short key: vendor units, the unit required
            out[field] = _with_unit(key, field, parse, value, where)
        else:  # an SI field name: a plain number in SI units, or a unit string
            out[field] = parse(value)
    return out


def _peaks(value: object) -> dict[str, float]:
    """`peak_dense` / `peak_flops_per_s`: a mapping of precision -> FLOP/s (unit strings or numbers)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of precision -> peak (e.g. {{bf16: 989.4 TFLOPS}}), not {value!r}")
    return {str(p): units.flops_per_s(v) for p, v in value.items()}


def _peaks_with_unit(value: object) -> dict[str, float]:
    if isinstance(value, Mapping):
        for p, v in value.items():
            _with_unit(f"peak_dense.{p}", "peak_flops_per_s", units.flops_per_s, v, "gpu.")
    return _peaks(value)


_CATALOG_REQUIRED = {"peak_dense", "memory", "memory_bandwidth", "gpu_link", "source"}
"""The keys of a whole catalog entry (`cluster_specs.catalog.gpu_from_entry` requires them)."""

_GPU: dict[str, _Quantity] = {
    "memory": ("memory_bytes", units.n_bytes),
    "memory_bandwidth": ("memory_bandwidth_bytes_per_s", units.bytes_per_s),
    "gpu_link": ("link_bandwidth_bytes_per_s", lambda v: units.bytes_per_s(v, require_direction=True)),
    "tdp": ("tdp_w", units.watts),
    "peak_dense": ("peak_flops_per_s", _peaks_with_unit),
}
"""A `gpu:` mapping's short keys, in the catalog's vendor units (data/gpus.yaml); the GPUSpec field
names beside them take SI numbers or unit strings, as a cluster's fields do."""

_GPU_SI: dict[str, Callable[[Any], Any]] = {
    "memory_bytes": units.n_bytes,
    "memory_bandwidth_bytes_per_s": units.bytes_per_s,
    "link_bandwidth_bytes_per_s": units.bytes_per_s,
    "tdp_w": units.watts,
    "peak_flops_per_s": _peaks,
}
"""SI field names of a `gpu:` mapping that also read unit strings."""


def _gpu(value: Any) -> GPUSpec:
    """A cluster's `gpu`: a catalog name, a whole catalog entry (data/gpus.yaml style: its measured
    matmul share kept), or a mapping of GPUSpec fields with the catalog's short keys in vendor units
    (`memory: 96 GiB`, `memory_bandwidth: 3.35 TB/s`, `gpu_link: 900 GB/s bidirectional`, `peak_dense:
    {bf16: 989.4 TFLOPS}`, `tdp: 700 W`) beside SI field names (numbers or unit strings)."""
    if isinstance(value, GPUSpec):
        return value
    if isinstance(value, str):
        return get_gpu(value)
    if isinstance(value, Mapping):
        entry = dict(value)
        name = str(entry.pop("name", "custom"))
        si_fields = {field for field, _ in _GPU.values()}
        if set(entry) >= _CATALOG_REQUIRED and not set(entry) & si_fields:
            return gpu_from_entry(name, entry, matmul_reference())
        return GPUSpec(name=name, **_convert(entry, _GPU, where="gpu.", si=_GPU_SI))
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
        fields["intra_node"] = _convert(fields["intra_node"], _INTRA, where="intra_node.")
    if "inter_node" in fields:
        fields["inter_node"] = _convert(fields["inter_node"], _INTER, where="inter_node.")
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
            over[sub] = {**_convert(base[sub], quantities), **_convert(over[sub], quantities, where=f"{sub}.")}
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
