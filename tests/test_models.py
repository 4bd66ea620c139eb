import numpy as np
import pytest
import torch

from raysim.models import ModelConfig, ParamSpec, build_model, initial_vector


@pytest.mark.parametrize("name,feature_shape,image_shape", [
    ("logreg", (64,), None), ("mlp", (64,), None), ("cnn", (64,), (1, 8, 8)), ("cnn", (40,), (1, 40)),
    ("cnn", (9,), (1, 3, 3)), ("cnn", (2,), (2, 1))])  # pooled while the map is 2 wide, then not
def test_models_map_features_to_class_logits(name, feature_shape, image_shape):
    module = build_model(ModelConfig(name=name), feature_shape, image_shape, 10)
    assert module(torch.zeros(5, *feature_shape)).shape == (5, 10)


def test_cnn_needs_an_image_shape():
    with pytest.raises(ValueError, match="model.name: 'cnn' needs"):
        build_model(ModelConfig(name="cnn"), (64,), None, 10)


def test_param_spec_round_trip_with_leading_dims():
    module = build_model(ModelConfig(name="mlp", hidden=[7, 5]), (4,), None, 3)
    spec = ParamSpec.of(module)
    assert spec.size == sum(p.numel() for p in module.parameters())
    flat = torch.randn(6, spec.size)
    named = spec.unflatten(flat)
    assert named["1.weight"].shape == (6, 7, 4)
    assert torch.equal(spec.flatten(named), flat)


def test_initial_vector_is_seeded_and_in_the_model_dtype():
    cfg = ModelConfig(name="mlp", dtype="float64")
    a, b, c = (initial_vector(cfg, (64,), None, 10, s) for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and a.dtype == np.float64
    state = torch.get_rng_state()
    initial_vector(cfg, (64,), None, 10, 5)
    assert torch.equal(state, torch.get_rng_state())  # the global torch RNG is left alone
