"""Where it runs: GPU catalog (`catalog`), `ClusterSpec` (`spec`), presets and user cluster files
(`presets`), and the topology model (`topology`: imported on its own, it pulls in networkx).

All quantities are SI (FLOP/s, bytes, bytes/s one direction, seconds); vendor units are converted
once, when the YAML data is loaded (`units`).
"""

from cluster_specs.catalog import get_gpu, list_gpus
from cluster_specs.presets import cluster_from_dict, get_cluster, list_clusters, load_cluster_yaml
from cluster_specs.spec import ClusterSpec, GPUSpec, InterNodeNetwork, IntraNodeFabric

__all__ = [
    "ClusterSpec",
    "GPUSpec",
    "InterNodeNetwork",
    "IntraNodeFabric",
    "cluster_from_dict",
    "get_cluster",
    "get_gpu",
    "list_clusters",
    "list_gpus",
    "load_cluster_yaml",
]
