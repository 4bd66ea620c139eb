import numpy as np
import torch

from raysim.core.rng import SERVER, SETUP, stream, torch_stream


def test_streams_are_keyed_and_reproducible():
    draw = lambda *key: stream(*key).random(4)  # noqa: E731
    np.testing.assert_array_equal(draw(1, 2, 3, "step"), draw(1, 2, 3, "step"))
    keys = [(1, 2, 3, "step"), (2, 2, 3, "step"), (1, 3, 3, "step"), (1, 2, 4, "step"), (1, 2, 3, "compute"),
            (1, SETUP, SERVER, "step"), (1, 0, 0, "step")]
    values = [tuple(draw(*k)) for k in keys]
    assert len(set(values)) == len(keys)


def test_torch_stream_matches_its_key():
    a = torch.rand(3, generator=torch_stream(0, 1, 2, "x"))
    assert torch.equal(a, torch.rand(3, generator=torch_stream(0, 1, 2, "x")))
    assert not torch.equal(a, torch.rand(3, generator=torch_stream(0, 1, 2, "y")))
