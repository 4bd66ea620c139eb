"""algorithms/kernel/kernels.py: gpytorch as an exact float64 Gram provider, against the closed forms."""
import numpy as np
import pytest

from raysim.algorithms.kernel.algorithm import KernelFedAvg, KernelFedProx
from raysim.contract import ClientData, Context
from raysim.algorithms.kernel.kernels import GPyTorch, make_kernel


def closed_form(name, x, z, lengthscale, variance, nu=2.5):
    r = np.sqrt(((x[:, None, :] - z[None, :, :]) ** 2).sum(-1)) / lengthscale
    if name == "rbf":
        return variance * np.exp(-r * r / 2)
    poly = {0.5: 1.0, 1.5: 1 + np.sqrt(3) * r, 2.5: 1 + np.sqrt(5) * r + 5 * r * r / 3}[nu]
    return variance * poly * np.exp(-np.sqrt(2 * nu) * r)


@pytest.mark.parametrize("name,nu", [("rbf", 2.5), ("matern", 0.5), ("matern", 1.5), ("matern", 2.5)])
def test_gpytorch_gram_equals_closed_form_in_float64(name, nu):
    rng = np.random.default_rng(0)
    x, z = rng.normal(size=(30, 3)), rng.normal(size=(20, 3))
    K = GPyTorch(name, 0.7, 1.3, nu).gram(x, z)
    assert K.dtype == np.float64
    assert np.max(np.abs(K - closed_form(name, x, z, 0.7, 1.3, nu))) < 1e-12


def test_gpytorch_large_gram_is_materialised_exactly():
    """Above gpytorch's max_cholesky_size (800) nothing switches to CG/Lanczos: the Gram is dense and exact."""
    x = np.random.default_rng(1).uniform(size=(900, 1))
    K = GPyTorch("rbf", 0.2).gram(x, x)
    assert np.max(np.abs(K - make_kernel("rbf", lengthscale=0.2).gram(x, x))) < 1e-12


def test_gpytorch_backend_gives_the_same_iterates():
    rng = np.random.default_rng(2)
    sizes = [6, 15]
    datas = [ClientData(c, rng.uniform(size=n), np.sin(3 * rng.uniform(size=n))) for c, n in enumerate(sizes)]
    thetas = []
    for backend in ("raysim", "gpytorch"):
        params = KernelFedProx.Params(form="representer", kernel="matern", nu=1.5, lengthscale=0.3, eta=0.5,
                                      backend=backend)
        algo = KernelFedProx(Context(0, 3, 2, 2, np.asarray(sizes), (1,), None, 0, None, params))
        state = algo.init()
        for t in range(3):
            plan = algo.plan(state, t, None)
            state, _ = algo.aggregate(state, [algo.step(None, d, plan.broadcast, None)[0] for d in datas], None)
        thetas.append(algo.predict(state, np.linspace(0, 1, 11)))
    assert np.max(np.abs(thetas[0] - thetas[1])) < 1e-12


def test_gpytorch_backend_validation():
    with pytest.raises(ValueError, match="backend"):
        KernelFedAvg.Params(form="representer", kernel="sobolev", backend="gpytorch")
    with pytest.raises(ValueError, match="allowed"):
        GPyTorch("linear")
