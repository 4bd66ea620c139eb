"""Federated datasets: sources, partitioners, and the Parquet files client actors read from."""
from raysim.data.config import DataConfig, PartitionConfig
from raysim.data.federated import FederatedData, build_federated, read_clients, read_table_arrays
from raysim.data.partition import PARTITIONERS, partition, register_partitioner
from raysim.data.sources import NATURAL_SOURCES, SOURCES, Source, load_source, register_source

__all__ = [
    "DataConfig",
    "FederatedData",
    "NATURAL_SOURCES",
    "PARTITIONERS",
    "PartitionConfig",
    "SOURCES",
    "Source",
    "build_federated",
    "load_source",
    "partition",
    "read_clients",
    "read_table_arrays",
    "register_partitioner",
    "register_source",
]
