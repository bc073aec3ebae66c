"""Cluster presets, user YAML and dict clusters."""

import pytest

from cluster_specs.catalog import get_gpu
from cluster_specs.presets import cluster_from_dict, get_cluster, list_clusters, load_cluster_yaml

REQUIRED = [
    "dgx-a100-40g",
    "dgx-a100-80g",
    "dgx-h100",
    "dgx-h800",
    "dgx-h200",
    "dgx-b200",
    "dgx-b300",
    "gb200-nvl72",
    "gb300-nvl72",
    "mi300x-8",
    "l40s-pcie-8",
    "rtx4090-pcie-8",
    "grand-teton-h100",
    "gcp-a2-ultragpu-8g",
    "local-cpu",
]


def test_every_preset_loads():
    assert set(REQUIRED) <= set(list_clusters())
    for name in list_clusters():
        c = get_cluster(name)
        assert c.name == name and c.source and c.intra_node.source
        assert (
            c.intra_node.bus_bandwidth_bytes_per_s <= c.gpu.link_bandwidth_bytes_per_s
            or c.gpu.vendor == "cpu"
        )
        assert c.host_memory_bytes > 2**30 and c.host_to_device_bytes_per_s > 1e9
        assert c.cpu_cores >= 1 and c.host_memory_bandwidth_bytes_per_s > 1e9, name
        assert c.has_nvme == (c.nvme_bytes > 0), name
        if c.has_nvme:
            assert c.nvme_read_bytes_per_s > 1e9 and c.nvme_write_bytes_per_s > 1e9, name


def test_dgx_h100():
    c = get_cluster("DGX_H100")
    assert c.gpu == get_gpu("h100") and c.gpus_per_node == 8 and c.domain_size == 8
    assert c.intra_node.kind == "nvswitch"
    assert c.intra_node.bus_bandwidth_bytes_per_s == pytest.approx(368e9)
    net = c.inter_node
    assert (net.kind, net.nics_per_node, net.rail_optimized) == ("infiniband", 8, True)
    assert net.nic_bandwidth_bytes_per_s == pytest.approx(50e9)  # 400 Gb/s
    assert c.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(50e9)
    assert c.host_memory_bytes == 2 * 2**40


def test_nvl72_and_local_cpu():
    gb = get_cluster("gb200-nvl72")
    assert (gb.gpus_per_node, gb.domain_size) == (4, 72)
    assert gb.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(50e9)
    cpu = get_cluster("local-cpu")
    assert cpu.gpu.vendor == "cpu" and cpu.intra_node.kind == "shared_memory"
    assert cpu.inter_node.kind == "none" and cpu.nic_bandwidth_per_gpu_bytes_per_s == 0.0


def test_pcie_nics_shared():
    l40s = get_cluster("l40s-pcie-8")
    assert l40s.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(2 * 25e9 / 8)


def test_unknown_preset_lists_known():
    with pytest.raises(KeyError, match="dgx-h100"):
        get_cluster("dgx-z9000")


def test_dict_with_catalog_gpu_and_units():
    c = cluster_from_dict(
        {
            "gpu": "h100",
            "gpus_per_node": 8,
            "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s", "latency": "2 us"},
            "inter_node": {
                "kind": "roce",
                "nics_per_node": 4,
                "nic_bandwidth_bytes_per_s": "400 Gb/s",
                "oversubscription": 2,
            },
            "host_memory_bytes": 2**40,
        },
        name="mine",
    )
    assert c.name == "mine" and c.gpu.name == "H100-80GB"
    assert c.intra_node.latency_s == pytest.approx(2e-6)
    assert c.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(4 * 50e9 / 8)
    assert c.inter_node.oversubscription == 2
    assert c.host_memory_bytes == 2**40


def test_dict_with_inline_gpu():
    gpu = {
        "name": "toy",
        "peak_dense": {"bf16": "100 TFLOPS"},
        "memory": "16 GiB",
        "memory_bandwidth": "1 TB/s",
        "gpu_link": "100 GB/s bidirectional",
        "source": "test",
    }
    c = cluster_from_dict(
        {"gpu": gpu, "gpus_per_node": 2, "intra_node": {"kind": "nvlink_mesh", "bus_bandwidth": "40 GB/s"}}
    )
    assert c.gpu.name == "toy" and c.gpu.memory_bytes == 16 * 2**30
    assert c.gpu.link_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_dict_errors():
    base = {
        "gpu": "h100",
        "gpus_per_node": 8,
        "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s"},
    }
    with pytest.raises(ValueError, match="twice"):
        cluster_from_dict({**base, "host_memory": "1 TiB", "host_memory_bytes": 2**40})
    with pytest.raises(ValueError, match="multiple of gpus_per_node"):
        cluster_from_dict({**base, "nvlink_domain_size": 12})
    with pytest.raises(ValueError, match="nics_per_node"):
        cluster_from_dict({**base, "inter_node": {"nics_per_node": 3}})
    with pytest.raises(KeyError, match="unknown GPU"):
        cluster_from_dict({**base, "gpu": "h1000"})
    with pytest.raises(ValueError, match="needs a 'gpu'"):
        cluster_from_dict({"gpus_per_node": 8})


def test_load_cluster_yaml(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(
        "gpu: A100-80GB\n"
        "gpus_per_node: 4\n"
        "intra_node: {kind: nvlink_mesh, bus_bandwidth: 100 GB/s, latency: 2.5 us}\n"
        "inter_node: {kind: ethernet, nics_per_node: 1, nic_bandwidth: 100 Gb/s, rail_optimized: false}\n"
        "host_memory: 512 GiB\n"
        "host_to_device: 25 GB/s\n"
    )
    c = load_cluster_yaml(path)
    assert c.name == "lab" and c.gpus_per_node == 4
    assert c.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(12.5e9 / 4)
    assert c.host_memory_bytes == 512 * 2**30


def test_dgx_a100_80g_host_facts():
    c = get_cluster("dgx-a100-80g")
    assert c.cpu_cores == 128  # 2x EPYC 7742
    assert c.host_memory_bandwidth_bytes_per_s == pytest.approx(409.6e9)  # 2 x 8 x DDR4-3200 x 8 B
    assert c.has_nvme and c.nvme_bytes == 8 * 3_840_000_000_000  # 8x 3.84 TB, decimal
    assert c.nvme_read_bytes_per_s > c.nvme_write_bytes_per_s > 0
    assert get_cluster("dgx-a100-40g").nvme_bytes == c.nvme_bytes // 2  # 4x 3.84 TB
    assert get_cluster("dgx-h100").cpu_cores == 112
    assert get_cluster("dgx-h100").host_memory_bandwidth_bytes_per_s == pytest.approx(614.4e9)
    assert not get_cluster("local-cpu").has_nvme


def test_gcp_a2_ultragpu_has_no_infiniband():
    c = get_cluster("GCP_A2_ultragpu_8g")
    assert c.name == "gcp-a2-ultragpu-8g" and c.gpu == get_gpu("A100-80GB") and c.gpus_per_node == 8
    assert c.intra_node == get_cluster("dgx-a100-80g").intra_node
    net = c.inter_node
    assert (net.kind, net.nics_per_node, net.rail_optimized) == ("ethernet", 1, False)
    assert net.nic_bandwidth_bytes_per_s == pytest.approx(12.5e9)  # 100 Gb/s for the whole VM
    assert c.nic_bandwidth_per_gpu_bytes_per_s == pytest.approx(12.5e9 / 8)
    assert c.host_memory_bytes == 1360 * 2**30 and c.cpu_cores == 48
    assert c.nvme_bytes == 8 * 375 * 2**30 and c.has_nvme


def test_host_fact_short_keys_take_units():
    c = cluster_from_dict(
        {
            "gpu": "h100",
            "gpus_per_node": 8,
            "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s"},
            "host_memory_bandwidth": "614.4 GB/s",
            "cpu_cores": 112,
            "nvme": "30 TB",
            "nvme_read": "25 GB/s",
            "nvme_write": "12000 MB/s",
        }
    )
    assert c.host_memory_bandwidth_bytes_per_s == pytest.approx(614.4e9)
    assert c.cpu_cores == 112
    assert c.nvme_bytes == 30 * 10**12  # TB is decimal
    assert c.nvme_read_bytes_per_s == pytest.approx(25e9)
    assert c.nvme_write_bytes_per_s == pytest.approx(12e9)
    assert c.has_nvme
    tib = cluster_from_dict({**_BASE, "nvme": "2 TiB", "nvme_read": "1 GB/s", "nvme_write": "1 GB/s"})
    assert tib.nvme_bytes == 2 * 2**40  # TiB is binary
    si = cluster_from_dict(
        {**_BASE, "nvme_bytes": 10**12, "nvme_read_bytes_per_s": "2 GB/s", "nvme_write_bytes_per_s": 1e9}
    )
    assert (si.nvme_bytes, si.nvme_read_bytes_per_s, si.nvme_write_bytes_per_s) == (10**12, 2e9, 1e9)


def test_host_fact_defaults():
    c = cluster_from_dict(_BASE)
    assert c.cpu_cores == 64 and c.host_memory_bandwidth_bytes_per_s == pytest.approx(409.6e9)
    assert c.nvme_bytes == 0 and not c.has_nvme
    assert c.nvme_read_bytes_per_s == c.nvme_write_bytes_per_s == 0.0


def test_host_facts_override_a_preset():
    base = get_cluster("dgx-a100-80g")
    no_nvme = cluster_from_dict({"preset": "dgx-a100-80g", "nvme": "0 B"})
    assert no_nvme.name == "dgx-a100-80g-custom" and not no_nvme.has_nvme
    assert no_nvme.nvme_read_bytes_per_s == base.nvme_read_bytes_per_s  # the rest stays the preset's
    assert no_nvme.cpu_cores == base.cpu_cores and no_nvme.intra_node == base.intra_node
    assert "nvme_bytes" in no_nvme.source
    small = cluster_from_dict(
        {"preset": "dgx-a100-80g", "nvme": "500 GB", "nvme_write": "1 GB/s", "cpu_cores": 16,
         "host_memory_bandwidth": "100 GB/s"}
    )  # fmt: skip
    assert small.nvme_bytes == 500 * 10**9 and small.nvme_write_bytes_per_s == pytest.approx(1e9)
    assert small.nvme_read_bytes_per_s == base.nvme_read_bytes_per_s
    assert small.cpu_cores == 16 and small.host_memory_bandwidth_bytes_per_s == pytest.approx(100e9)
    # a short key overrides the preset's field of the same meaning, given either way
    si = cluster_from_dict({"preset": "dgx-a100-80g", "nvme_bytes": 10**12})
    assert si.nvme_bytes == 10**12
    added = cluster_from_dict(
        {"preset": "local-cpu", "nvme": "1 TB", "nvme_read": "3 GB/s", "nvme_write": "2 GB/s"}
    )
    assert added.has_nvme and added.nvme_read_bytes_per_s == pytest.approx(3e9)


def test_nvme_capacity_needs_bandwidth():
    with pytest.raises(ValueError, match="nvme_read_bytes_per_s and nvme_write_bytes_per_s"):
        cluster_from_dict({**_BASE, "nvme": "1 TB"})
    with pytest.raises(ValueError, match="nvme_bytes"):
        cluster_from_dict({**_BASE, "nvme": "1 TB", "nvme_read": "3 GB/s"})
    with pytest.raises(ValueError, match="nvme_write_bytes_per_s"):
        cluster_from_dict({"preset": "local-cpu", "nvme": "1 TB", "nvme_read": "3 GB/s"})
    with pytest.raises(ValueError, match="twice"):
        cluster_from_dict({**_BASE, "nvme": "1 TB", "nvme_bytes": 10**12})
    with pytest.raises(ValueError):
        cluster_from_dict({**_BASE, "cpu_cores": 0})
    with pytest.raises(ValueError):
        cluster_from_dict({**_BASE, "host_memory_bandwidth": "0 GB/s"})
    # bandwidth without capacity is allowed (and unused)
    assert not cluster_from_dict({**_BASE, "nvme_read": "3 GB/s", "nvme_write": "2 GB/s"}).has_nvme


_BASE = {
    "gpu": "h100",
    "gpus_per_node": 8,
    "intra_node": {"kind": "nvswitch", "bus_bandwidth": "368 GB/s"},
}
