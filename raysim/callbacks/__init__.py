"""Callbacks around a run: hooks at run start, after every saved round and at run end, from Python
(`raysim.run(..., callbacks=[...])`) or from the config's `callbacks:` list."""
from raysim.callbacks.base import Callback, RoundCallback, RunContext, ServerView
from raysim.callbacks.config import CallbackConfig, build_callbacks
from raysim.callbacks.metric import BestModel, EarlyStopping
from raysim.callbacks.trackers import Mlflow, Wandb
from raysim.callbacks.writers import CsvLogger, TensorBoard

__all__ = ["BestModel", "Callback", "CallbackConfig", "CsvLogger", "EarlyStopping", "Mlflow", "RoundCallback", "RunContext",
           "ServerView", "TensorBoard", "Wandb", "build_callbacks"]
