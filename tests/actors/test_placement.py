import pytest

from raysim.actors.placement import client_resources
from raysim.config import ClusterConfig


@pytest.mark.parametrize("actors", [1, 2, 3, 7, 100])
def test_cpu_shares_never_exceed_the_cluster(actors):
    r = client_resources(ClusterConfig(), actors, total_cpus=2, total_gpus=0)
    assert actors * r.num_cpus <= 2 and r.num_cpus > 0
    assert r.num_gpus == 0 and r.cuda_memory_fraction is None
    assert r.torch_threads == 1  # the default: the same bits in every layout
    assert client_resources(ClusterConfig(torch_threads=4), actors, 2, 0).torch_threads == max(1, int(2 / actors))


def test_fractional_gpu_capped_to_the_same_share():
    r = client_resources(ClusterConfig(), 3, total_cpus=16, total_gpus=1)
    assert r.num_gpus == r.cuda_memory_fraction == 0.3333
    assert client_resources(ClusterConfig(gpu_fraction=0.25), 3, 16, 1).num_gpus == 0.25
    assert r.options() == {"num_cpus": 5.3333, "num_gpus": 0.3333}
    assert r.threads == 5  # the host's share of a GPU shard's work: a thread per whole CPU
