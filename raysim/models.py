"""Torch models by name, and the flat-vector view of their parameters.

Parameters travel as one flat numpy vector (cheap to `ray.put`, zero-copy to read, one add to
aggregate); `ParamSpec` maps it to the named tensors that `torch.func.functional_call` takes.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from raysim.errors import ConfigError
from raysim.plugins import MODELS

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def register_model(name: str, replace: bool = False):
    """Register a model builder `f(cfg, feature_shape, image_shape, num_classes) -> nn.Module`; `replace` to take
    the name of another module's model."""

    def wrap(fn):
        MODELS.add(name, fn, replace)
        return fn

    return wrap


class ModelConfig(BaseModel):
    """The `model:` section: an architecture name and its sizes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("mlp", description="a registered model: logreg, mlp, cnn or one added with @register_model")
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [64], description="widths of the mlp's hidden layers")
    channels: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [16, 32], description="the cnn's channels per convolution")
    dtype: Literal["float32", "float64"] = "float32"
    init_scale: float = Field(1.0, gt=0)
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where client steps and the server's evaluation run: auto, a GPU where the process has"
                            " one (a client actor given a GPU share, the local backend's process, the server's); cpu;"
                            " cuda (an error where there is none)")
    tf32: bool = Field(False, description="on a GPU, TF32 matmuls and convolutions (faster, about three decimal digits);"
                                          " off, with deterministic kernels, a seed gives the same numbers run after run")

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        return MODELS.check(name)


@register_model("logreg")
def _logreg(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(feature_shape), num_classes))


@register_model("mlp")
def _mlp(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(feature_shape)
    for h in cfg.hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


@register_model("cnn")
def _cnn(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """A small CNN (1-D or 2-D inputs): per entry of `channels`, a 3x3 convolution with ReLU and a 2x2 max-pool
    while the map is at least 2 wide, then a linear head on the flattened map. The pooled map keeps where features
    are, which a global average throws away: on the quickstart (8x8 digits) it reaches about 0.92 test accuracy."""
    if image_shape is None:
        raise ConfigError("model.name: 'cnn' needs a data source with an image shape (digits, mnist1d, an image "
                         "or array column, or data.feature_shape)")
    conv, pool = (nn.Conv2d, nn.MaxPool2d) if len(image_shape) == 3 else (nn.Conv1d, nn.MaxPool1d)
    layers: list[nn.Module] = [nn.Unflatten(1, tuple(image_shape))]
    c_in, size = image_shape[0], list(image_shape[1:])
    for c in cfg.channels:
        layers += [conv(c_in, c, 3, padding=1), nn.ReLU()]
        if min(size) >= 2:
            layers.append(pool(2))
            size = [s // 2 for s in size]
        c_in = c
    layers += [nn.Flatten(), nn.Linear(c_in * math.prod(size), num_classes)]
    return nn.Sequential(*layers)


def build_model(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """Instantiate the configured architecture in the configured dtype. A layer of no parameters (a classifier's head
    on data without classes: real targets) is a model the data cannot feed: ConfigError naming model.name."""
    with warnings.catch_warnings():  # torch's note on an empty layer: the error below says what it means
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        module = MODELS.lookup(cfg.name)(cfg, tuple(feature_shape), image_shape, num_classes)
    empty = next((name for name, p in module.named_parameters() if p.numel() == 0), None)
    if empty is not None:
        what = f"{num_classes} classes" if num_classes else "no classes (real targets)"
        raise ConfigError(f"model.name: {cfg.name!r} has no parameters in {empty} for data of {feature_shape} features"
                          f" and {what}; choose a model for these targets or a source with class labels")
    return module.to(DTYPES[cfg.dtype])


@dataclass(frozen=True)
class ParamSpec:
    """Names and shapes of a module's parameters, in order, to (un)flatten a parameter vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, module: nn.Module) -> "ParamSpec":
        named = list(module.named_parameters())
        return cls(tuple(n for n, _ in named), tuple(tuple(p.shape) for _, p in named))

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of `flat` (shape [..., size]) as named parameters with the same leading dims."""
        lead = flat.shape[:-1]
        out, i = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            out[name] = flat[..., i : i + n].reshape(*lead, *shape)
            i += n
        return out

    def flatten(self, params: dict[str, torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """One vector (per leading index) from named parameters, written into `out` when given (a buffer reused
        step after step is spared the fresh pages a new one faults in). Copied into one buffer where nothing asks
        for a gradient: on a CPU thread `cat` along the last axis of many rows is six times slower."""
        first = params[self.names[0]]
        lead = first.shape[: first.dim() - len(self.shapes[0])]
        parts = [params[n].reshape(*lead, -1) for n in self.names]
        if out is None and (any(p.requires_grad for p in parts) or len({p.dtype for p in parts}) > 1):
            return torch.cat(parts, dim=-1)
        out, i = first.new_empty((*lead, self.size)) if out is None else out, 0
        for p in parts:
            out[..., i:i + p.shape[-1]].copy_(p)
            i += p.shape[-1]
        return out

    def module_with(self, module: nn.Module, flat: np.ndarray, dtype: torch.dtype) -> nn.Module:
        """A CPU copy of `module` in `dtype` holding the parameter vector `flat` (what `raysim export` saves)."""
        out = copy.deepcopy(module).to(device="cpu", dtype=dtype)
        with torch.no_grad():
            for name, value in self.unflatten(torch.as_tensor(np.asarray(flat), dtype=dtype)).items():
                out.get_parameter(name).copy_(value)
        return out


def initial_vector(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int, seed: int) -> np.ndarray:
    """The seeded initial parameter vector: PyTorch's default init under a forked, seeded RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_model(cfg, feature_shape, image_shape, num_classes)
    flat = ParamSpec.of(module).flatten(dict(module.named_parameters())).detach()
    return (flat * cfg.init_scale).numpy()


def placed_model(ctx) -> tuple[nn.Module, "ParamSpec", torch.dtype, torch.device]:
    """An algorithm's model from its Context: built in the configured dtype, moved to ctx.device,
    with the ParamSpec that maps it to flat parameter vectors."""
    module = build_model(ctx.model, ctx.feature_shape, ctx.image_shape, ctx.num_classes)
    device = torch.device(ctx.device)
    return module.to(device), ParamSpec.of(module), DTYPES[ctx.model.dtype], device
