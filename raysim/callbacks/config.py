"""The config's `callbacks:` list: one typed entry per built-in callback, checked with the rest of the
config before Ray starts, and turned into callback objects by `build_callbacks`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from raysim.callbacks.trackers import missing_extra

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


class _TrackerEntry(_Entry):
    """A tracker's entry: refused at validation, in one line naming the extra, when its library is missing."""

    @model_validator(mode="after")
    def _library_installed(self):
        problem = missing_extra(self.kind, self.kind)
        if problem is not None:
            raise ValueError(problem)
        return self


class WandbEntry(_TrackerEntry):
    kind: Literal["wandb"]
    project: str = Field("raysim", min_length=1, description="the W&B project")
    name: str | None = Field(None, description="the W&B run name; default: the run directory's name")


class MlflowEntry(_TrackerEntry):
    kind: Literal["mlflow"]
    tracking_uri: str | None = Field(None, description="default: the file store RUN/mlruns")
    experiment: str | None = Field(None, description="default: the config's name")
    run_name: str | None = Field(None, description="default: the run directory's name")


class MetricEntry(_Entry):
    """A callback that watches one metric (early stopping, the best model), checked before the run."""

    metric: str = Field(description="a column of rounds.parquet, e.g. test_accuracy")
    mode: Literal["max", "min"] | None = Field(None, description="default: max for accuracies, min otherwise")
    min_delta: float = Field(0.0, ge=0, description="a change of at most this is no improvement")


class EarlyStoppingEntry(MetricEntry):
    kind: Literal["early_stopping"]
    patience: int = Field(ge=1, description="evaluations without improvement before the run stops")


class BestModelEntry(MetricEntry):
    kind: Literal["best_model"]


CallbackConfig = Annotated[Union[TensorBoardEntry, CsvEntry, WandbEntry, MlflowEntry, EarlyStoppingEntry, BestModelEntry],
                           Field(discriminator="kind")]


def build_callbacks(entries: list) -> list[Callback]:
    """The callback objects of a config's `callbacks:` list, in order."""
    from raysim.callbacks.metric import BestModel, EarlyStopping
    from raysim.callbacks.trackers import Mlflow, Wandb
    from raysim.callbacks.writers import CsvLogger, TensorBoard

    out: list[Callback] = []
    for i, e in enumerate(entries):
        field = f"callbacks.{i}"
        if isinstance(e, TensorBoardEntry):
            out.append(TensorBoard(e.log_dir))
        elif isinstance(e, CsvEntry):
            out.append(CsvLogger(e.path))
        elif isinstance(e, WandbEntry):
            out.append(Wandb(e.project, e.name))
        elif isinstance(e, MlflowEntry):
            out.append(Mlflow(e.tracking_uri, e.experiment, e.run_name))
        elif isinstance(e, EarlyStoppingEntry):
            out.append(EarlyStopping(e.metric, e.patience, e.mode, e.min_delta, field))
        else:
            out.append(BestModel(e.metric, e.mode, e.min_delta, field))
    return out
