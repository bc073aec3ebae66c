"""A cluster's short keys carry their vendor unit (a bare number is refused, naming the field and the
units); a `gpu:` mapping takes the catalog's vendor keys beside SI names; a dumped spec (SI, with
unset optional fields) loads back to itself."""

from __future__ import annotations

import pytest

from cluster_specs.presets import cluster_from_dict, get_cluster, list_clusters

BASE = {"gpus_per_node": 8, "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s"}}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpu": "H100-80GB", "host_memory": 512}, "host_memory: 512 has no unit"),
        ({"gpu": "H100-80GB", "intra_node": {"kind": "nvswitch", "bus_bandwidth": 368}}, "bus_bandwidth: 368 has no unit"),
        ({"gpu": "H100-80GB", "nvme_read": 24}, "nvme_read: 24 has no unit"),
        ({"gpu": {"name": "g", "memory": 80, "memory_bandwidth": "3 TB/s", "gpu_link": "900 GB/s bidirectional",
                  "peak_dense": {"bf16": "989 TFLOPS"}}}, "gpu.memory: 80 has no unit"),
    ],
)
def test_a_short_key_without_its_unit_is_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        cluster_from_dict({**BASE, **fields}, name="x")
    assert "units:" in str(info.value) and "as a plain number in SI units" in str(info.value)


def test_zero_and_si_fields_take_plain_numbers() -> None:
    c = cluster_from_dict({**BASE, "gpu": "H100-80GB", "nvme": 0, "host_memory_bytes": 2**39}, name="x")
    assert c.nvme_bytes == 0 and c.host_memory_bytes == 2**39


def test_gpu_mapping_in_vendor_units() -> None:
    c = cluster_from_dict({**BASE, "gpu": {
        "name": "my-h100", "memory": "80 GiB", "memory_bandwidth": "3.35 TB/s", "gpu_link": "900 GB/s bidirectional",
        "peak_dense": {"bf16": "989.4 TFLOPS"}, "tdp": "700 W",
    }}, name="x")
    assert (c.gpu.memory_bytes, c.gpu.link_bandwidth_bytes_per_s, c.gpu.tdp_w) == (80 * 2**30, 450e9, 700.0)
    assert c.gpu.peak_flops_per_s == {"bf16": 989.4e12}


@pytest.mark.parametrize("name", list_clusters())
def test_a_dumped_spec_loads_back(name: str) -> None:
    spec = get_cluster(name)
    assert cluster_from_dict(spec.model_dump(mode="json")) == spec
