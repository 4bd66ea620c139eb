"""The `data:` section: which source, how many clients, how the training set is split among them.

`source` and `partition.kind` accept the built-in names and any name registered with
`@register_source` / `@register_partitioner` before the config is validated.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raysim.core.field_errors import field_errors
from raysim.data.partition import NATURAL
from raysim.data.sources import is_natural, natural_sources
from raysim.plugins import PARTITIONERS, SOURCES

SHAPED_SOURCES = ("parquet", "huggingface")  # the sources that read data.feature_shape


class PartitionConfig(BaseModel):
    """How the pooled training samples are assigned to clients."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field("iid", description="iid, dirichlet, shards, quantity, natural, or a registered partitioner")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration over clients, per label")
    shards_per_client: int = Field(2, ge=1, description="label-sorted shards dealt to each client")
    quantity_sigma: float = Field(1.0, gt=0, description="lognormal sigma of the client sizes (quantity skew)")
    min_size: int = Field(1, ge=1, description="training samples every client gets at least")
    numpy_seed: int | None = Field(None, ge=0, description="dirichlet_classes only: draw from numpy's legacy "
                                   "np.random.seed(numpy_seed) stream, bitwise the FedFisher code's split of the same "
                                   "labels; None: raysim's stream")

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        return PARTITIONERS.check(kind, NATURAL)

    @model_validator(mode="after")
    def _numpy_seed_kind(self) -> PartitionConfig:
        if self.numpy_seed is not None and self.kind != "dirichlet_classes":
            raise ValueError(f"data.partition.numpy_seed: only kind 'dirichlet_classes' draws from numpy's legacy "
                             f"stream, not kind {self.kind!r}")
        return self


class DataConfig(BaseModel):
    """A federated dataset: a source, a global stratified test set, a partition of the rest."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field("digits", description="digits, mnist1d, synthetic, parquet, or a registered source")
    client_rows: Literal["auto", "memory", "disk"] = Field(
        "auto", description="where shards keep their clients' rows: memory (read once), disk (read each round, for"
                            " the round's clients, from flat files beside the Parquet file); auto: disk above 1 GiB of"
                            " training features")
    num_clients: int = Field(0, ge=0, description="the federation's clients; under partition natural, left out (0)"
                             " it is the source's own count (parquet, huggingface)")
    test_fraction: float = Field(0.2, description="share of the samples held out as the server's test set, in (0, 1)")
    test_split: Literal["holdout", "source"] = Field(
        "holdout", description="holdout: a stratified test_fraction of the pooled samples; source: the source's own test set")
    local_test_fraction: float = Field(0.0, ge=0, lt=1, description="share of each client's training samples held"
                                       " out as its local test set, stratified by label (floor(fraction x n) of a client's"
                                       " n), for federated evaluation (eval.clients); 0: clients are evaluated on their"
                                       " training data")
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    partition_seed: int | None = Field(None, ge=0, description="seed of the data (generation, test split, partition, "
                                       "server validation samples), fixed across experiment seeds; None: the experiment seed")
    path: str | None = Field(None, description="the Parquet file (source: parquet)")
    client_column: str = "client_id"
    label_column: str = "label"
    feature_columns: list[str] | None = Field(None, description="None: every other column of numbers, arrays or images")
    feature_shape: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, min_length=1, description="[C, H, W] or [C, L] of one sample, for CNNs (sources parquet, huggingface); "
        "None: the shape of a single array or image column")
    synthetic_samples: int = Field(10000, ge=1)
    synthetic_features: int = Field(60, ge=1)
    synthetic_classes: int = Field(10, ge=2)
    synthetic_alpha: float = Field(1.0, ge=0, description="model heterogeneity of Synthetic(alpha, beta)")
    synthetic_beta: float = Field(1.0, ge=0, description="data heterogeneity of Synthetic(alpha, beta)")
    mnist1d_samples: int = Field(4000, ge=10, description="rounded down to a multiple of 10 (balanced classes)")
    options: dict[str, Any] = Field(default_factory=dict, description="the source's own parameters, checked by the"
                                    " options model it registered (e.g. the kernel family's regression generators)")

    @field_validator("source")
    @classmethod
    def _known_source(cls, source: str) -> str:
        return SOURCES.check(source)

    @field_validator("test_fraction")
    @classmethod
    def _open_unit_interval(cls, value: float) -> float:
        if not 0 < value < 1:
            raise ValueError("must be in the open interval (0, 1)")
        return value

    def source_options(self) -> BaseModel | None:
        """The source's own parameters, validated by the options model it registered (None: it takes none)."""
        model = getattr(SOURCES.lookup(self.source), "options", None)
        return None if model is None else model(**self.options)

    def split_seed(self, seed: int) -> int:
        """The seed of the data: `partition_seed` when set (the FedFisher paper's code uses 3), else the experiment's."""
        return seed if self.partition_seed is None else self.partition_seed

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        try:
            if self.source_options() is None and self.options:
                raise ValueError(f"data.options: source {self.source!r} takes no options")
        except ValidationError as e:
            raise ValueError("; ".join(field_errors(e, "data.options"))) from None
        if self.feature_shape is not None and self.source not in SHAPED_SOURCES:
            raise ValueError(f"data.feature_shape applies to sources {list(SHAPED_SOURCES)}; "
                             f"source {self.source!r} has its own shape")
        if self.source == "parquet" and self.path is None:
            raise ValueError("data.path is required when data.source is 'parquet'")
        if self.partition.kind == NATURAL and not is_natural(self.source):
            raise ValueError(f"data.partition.kind 'natural' needs a source that assigns samples to clients "
                             f"({natural_sources()}), not data.source {self.source!r}")
        if self.feature_columns is not None:
            clash = {self.label_column, self.client_column} & set(self.feature_columns)
            if clash:
                raise ValueError(f"data.feature_columns must not contain the label or client column: {sorted(clash)}")
        return self
