"""Federated datasets: sources, partitioners, and the Parquet files client actors read from."""
from raysim.data.config import DataConfig, PartitionConfig
from raysim.data.federated import FederatedData, build_federated, read_clients, read_table_arrays
from raysim.data.partition import PARTITIONERS, partition, register_partitioner
from raysim.data.sources import NATURAL_SOURCES, SOURCES, Source, load_source, register_source
from raysim.data import smooth  # noqa: E402,F401  (registers the FedLRGD paper's smooth_logistic, smooth_ridge)
from raysim.data import regression  # noqa: F401  (registers the regression sources)
from raysim.data import objectives  # noqa: F401,E402  (registers the zeroth-order sources: blackbox, gaussian_mixture, covtype)

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
from raysim.data import vision  # noqa: F401,E402  (registers fashion_mnist, cifar10, svhn, cinic10, digits28)
