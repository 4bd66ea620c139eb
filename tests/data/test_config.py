"""DataConfig / PartitionConfig validation: every error names its field."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from raysim.config import ConfigError, load_config
from raysim.data import DataConfig, PartitionConfig, build_federated


def test_defaults():
    cfg = DataConfig(num_clients=4)
    assert (cfg.source, cfg.test_fraction, cfg.partition.kind, cfg.partition.min_size) == ("digits", 0.2, "iid", 1)


@pytest.mark.parametrize("value", [1.5, 0.0, 1.0, -0.1])
def test_test_fraction_must_be_in_open_unit_interval(value):
    with pytest.raises(ValidationError, match=r"(?s)test_fraction.*\(0, 1\)"):
        DataConfig(num_clients=4, test_fraction=value)


def test_parquet_needs_a_path():
    with pytest.raises(ValidationError, match=r"data\.path is required"):
        DataConfig(source="parquet", num_clients=4)


def test_natural_only_for_sources_with_clients():
    with pytest.raises(ValidationError, match=r"natural.*data\.source 'digits'"):
        DataConfig(num_clients=4, partition={"kind": "natural"})
    DataConfig(source="synthetic", num_clients=4, partition={"kind": "natural"})
    DataConfig(source="parquet", path="x.parquet", num_clients=4, partition={"kind": "natural"})


@pytest.mark.parametrize("kwargs, field", [
    ({"num_clients": -1}, "num_clients"),  # 0: left out, counted under partition natural
    ({"num_clients": 4, "source": "cifar"}, "source"),
    ({"num_clients": 4, "partition": {"kind": "pathological"}}, "partition.kind"),
    ({"num_clients": 4, "partition": {"alpha": 0}}, "partition.alpha"),
    ({"num_clients": 4, "partition": {"min_size": 0}}, "partition.min_size"),
    ({"num_clients": 4, "partition": {"shards_per_client": 0}}, "partition.shards_per_client"),
    ({"num_clients": 4, "batch": 3}, "batch"),
    ({"num_clients": 4, "feature_columns": ["a", "label"]}, "feature_columns"),
])
def test_errors_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as info:
        DataConfig(**kwargs)
    assert field in str(info.value)


def test_unknown_names_list_the_allowed_ones():
    with pytest.raises(ValidationError, match=r"allowed: \[.*'dirichlet'.*'natural'"):
        PartitionConfig(kind="label_skew")


def test_more_clients_than_training_samples_names_num_clients(tmp_path):
    cfg = DataConfig(num_clients=1797)  # valid on its own; only the loaded data shows the problem
    with pytest.raises(ValueError, match=r"data\.num_clients"):
        build_federated(cfg, 0, tmp_path)


def test_source_options_are_checked_by_the_source():
    with pytest.raises(ConfigError, match="data.options: source 'digits' takes no options"):
        load_config({"data": {"source": "digits", "num_clients": 2, "options": {"dim": 3}}})
