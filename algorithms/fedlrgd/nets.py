"""The FedLRGD paper's models: the bias-free linear score θᵀx of its
logistic and ridge problems, and Appendix C's networks with logistic (sigmoid) hidden units.

`linear`: θᵀx with one output per class (one output for regression or binary soft labels).
`sigmoid_mlp`: dense layers of `hidden` widths with sigmoid, then the output layer; with
hidden [784] on MNIST it has the paper's 623,290 parameters.
`sigmoid_cnn`: 3x3 "same" convolutions of `channels` filters with sigmoid, one 2x2 max-pool, dense
layers of `hidden` widths with sigmoid, the output layer; channels [40, 40] and hidden [150] on
CIFAR-10 give the paper's 1,553,220 parameters.
"""
from __future__ import annotations

import math

from torch import nn

from raysim.errors import ConfigError
from raysim.models import ModelConfig, register_model


def _outputs(num_classes: int) -> int:
    """One output per class, or one for a scalar target (num_classes 0)."""
    return num_classes if num_classes > 0 else 1


@register_model("linear")
def linear(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """θᵀx without bias (App. A's logistic regression, the README's ridge regression)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(feature_shape), _outputs(num_classes), bias=False))


def _dense(width: int, hidden: list[int], num_classes: int) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, h), nn.Sigmoid()]
        width = h
    return layers + [nn.Linear(width, _outputs(num_classes))]


@register_model("sigmoid_mlp")
def sigmoid_mlp(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """App. C's MNIST network: sigmoid hidden layers of `hidden` widths (the paper: [784])."""
    return nn.Sequential(nn.Flatten(), *_dense(math.prod(feature_shape), cfg.hidden, num_classes))


@register_model("sigmoid_cnn")
def sigmoid_cnn(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """App. C's CIFAR-10 network: same-padded 3x3 sigmoid convolutions, a 2x2 max-pool, sigmoid dense layers."""
    if image_shape is None or len(image_shape) != 3:
        raise ConfigError(f"model.name: 'sigmoid_cnn' needs a (channels, height, width) image shape, got {image_shape}")
    c, h, w = image_shape
    layers: list[nn.Module] = [nn.Unflatten(1, tuple(image_shape))]
    for filters in cfg.channels:
        layers += [nn.Conv2d(c, filters, 3, padding=1), nn.Sigmoid()]
        c = filters
    layers += [nn.MaxPool2d(2), nn.Flatten()]
    return nn.Sequential(*layers, *_dense(c * (h // 2) * (w // 2), cfg.hidden, num_classes))
