"""The FedFisher paper's models: parameter counts (Sec. 5.1, the paper code's architectures), shapes, no biases."""
import pytest
import torch

from raysim.models import ModelConfig, ParamSpec, build_model


@pytest.mark.parametrize("name,image,d", [("lenet", (1, 28, 28), 44_190), ("paper_cnn", (3, 32, 32), 939_616)])
def test_parameter_counts_and_outputs(name, image, d):
    module = build_model(ModelConfig(name=name), (int(torch.tensor(image).prod()),), image, 10)
    assert ParamSpec.of(module).size == d
    assert all(n.endswith("weight") for n, _ in module.named_parameters())
    assert module(torch.zeros(3, int(torch.tensor(image).prod()))).shape == (3, 10)


def test_mlp_nobias_is_the_mnist1d_proxy_size():
    module = build_model(ModelConfig(name="mlp_nobias", hidden=[256, 128]), (40,), (1, 40), 10)
    assert ParamSpec.of(module).size == 40 * 256 + 256 * 128 + 128 * 10 == 44_288


def test_too_small_images_fail_naming_the_field():
    with pytest.raises(ValueError, match="model.name"):
        build_model(ModelConfig(name="lenet"), (64,), (1, 8, 8), 10)
