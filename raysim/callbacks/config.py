"""The config's `callbacks:` list: one typed entry per built-in callback, checked with the rest of the
config before Ray starts, and turned into callback objects by `build_callbacks`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from raysim.callbacks.base import Callback


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorBoardEntry(_Entry):
    kind: Literal["tensorboard"]
    log_dir: str | None = Field(None, description="default: RUN/tensorboard")


class CsvEntry(_Entry):
    kind: Literal["csv"]
    path: str | None = Field(None, description="default: RUN/rounds.csv")


class _MetricEntry(_Entry):
    metric: str = Field(description="a column of rounds.parquet, e.g. test_accuracy")
    mode: Literal["max", "min"] | None = Field(None, description="default: max for accuracies, min otherwise")
    min_delta: float = Field(0.0, ge=0, description="a change of at most this is no improvement")


class EarlyStoppingEntry(_MetricEntry):
    kind: Literal["early_stopping"]
    patience: int = Field(ge=1, description="evaluations without improvement before the run stops")


class BestModelEntry(_MetricEntry):
    kind: Literal["best_model"]


CallbackConfig = Annotated[Union[TensorBoardEntry, CsvEntry, EarlyStoppingEntry, BestModelEntry],
                           Field(discriminator="kind")]


def build_callbacks(entries: list) -> list[Callback]:
    """The callback objects of a config's `callbacks:` list, in order."""
    from raysim.callbacks.metric import BestModel, EarlyStopping
    from raysim.callbacks.writers import CsvLogger, TensorBoard

    out: list[Callback] = []
    for i, e in enumerate(entries):
        field = f"callbacks.{i}"
        if isinstance(e, TensorBoardEntry):
            out.append(TensorBoard(e.log_dir))
        elif isinstance(e, CsvEntry):
            out.append(CsvLogger(e.path))
        elif isinstance(e, EarlyStoppingEntry):
            out.append(EarlyStopping(e.metric, e.patience, e.mode, e.min_delta, field))
        else:
            out.append(BestModel(e.metric, e.mode, e.min_delta, field))
    return out
