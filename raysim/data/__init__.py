"""Federated datasets: generic sources, partitioners, and the Parquet files client actors read from.

Paper-specific sources live in their family's plugin (`raysim.algorithms.<family>.sources`).
"""
from raysim.data.config import DataConfig, PartitionConfig
from raysim.data.federated import FederatedData, build_federated, read_client_block, read_clients, read_rows, read_table_arrays
from raysim.data.partition import partition, register_partitioner
from raysim.data.sources import ClientBlocks, Source, check_source, load_source, register_block_source, register_source
from raysim.data import vision  # noqa: F401  (registers fashion_mnist, cifar10, svhn, cinic10, digits28)
from raysim.data import huggingface_source, torchvision_source  # noqa: F401  (register huggingface, torchvision)
from raysim.data.torchvision_source import import_torchvision

__all__ = [
    "ClientBlocks",
    "DataConfig",
    "FederatedData",
    "PartitionConfig",
    "Source",
    "build_federated",
    "check_source",
    "import_torchvision",
    "load_source",
    "partition",
    "read_client_block",
    "read_clients",
    "read_rows",
    "read_table_arrays",
    "register_block_source",
    "register_partitioner",
    "register_source",
]
