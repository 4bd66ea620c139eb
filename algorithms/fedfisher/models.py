"""The FedFisher paper's bias-free models: LeNet, the 2-conv CNN, a bias-free MLP.

LeNet and the CNN are conv(k5) -> ReLU -> MaxPool2 twice, then three bias-free linear layers; LeNet has
44,190 parameters on 1x28x28 inputs, the CNN 939,616 on 3x32x32 inputs (Sec. 5.1, as the paper code builds them).
"""
from __future__ import annotations

import math

from torch import nn

from raysim.errors import ConfigError
from raysim.models import ModelConfig, register_model


def _conv_stack(image_shape: tuple | None, channels: tuple[int, int], hidden: tuple[int, int], num_classes: int) -> nn.Sequential:
    """Two bias-free conv(k5)+ReLU+MaxPool2 blocks and three bias-free linear layers."""
    if image_shape is None or len(image_shape) != 3:
        raise ConfigError(f"model.name: needs a data source with a (channels, height, width) image shape, got {image_shape}")
    c, h, w = image_shape
    side = [(s - 4) // 2 for s in (h, w)]
    side = [(s - 4) // 2 for s in side]
    if min(side) < 1:
        raise ConfigError(f"model.name: images of {h}x{w} are too small for two 5x5 conv + pool blocks (need >= 16x16)")
    flat = channels[1] * math.prod(side)
    return nn.Sequential(
        nn.Unflatten(1, tuple(image_shape)),
        nn.Conv2d(c, channels[0], 5, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(channels[0], channels[1], 5, bias=False), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, hidden[0], bias=False), nn.ReLU(),
        nn.Linear(hidden[0], hidden[1], bias=False), nn.ReLU(),
        nn.Linear(hidden[1], num_classes, bias=False),
    )


@register_model("lenet")
def lenet(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """LeNet of the paper's code (FashionMNIST): conv 6, 16; fc 120, 84; no biases."""
    return _conv_stack(image_shape, (6, 16), (120, 84), num_classes)


@register_model("paper_cnn")
def paper_cnn(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """The CNN of Wang et al. 2020a (SVHN, CIFAR-10, CINIC-10): conv 32, 64; fc 512, 128; no biases."""
    return _conv_stack(image_shape, (32, 64), (512, 128), num_classes)


@register_model("mlp_nobias")
def mlp_nobias(cfg: ModelConfig, feature_shape: tuple, image_shape: tuple | None, num_classes: int) -> nn.Module:
    """A bias-free ReLU MLP of widths `model.hidden` (the README's MNIST-1D proxy: 40-256-128-10)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(feature_shape)
    for h in cfg.hidden:
        layers += [nn.Linear(width, h, bias=False), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes, bias=False))
    return nn.Sequential(*layers)
