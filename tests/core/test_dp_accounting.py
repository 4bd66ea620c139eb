"""DP-FedAvg's accounting against dp-accounting's own RDP accountant, and the calibrated noise against its target."""
import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from raysim.core.privacy import calibrated_noise, epsilon_after


def reference(n, k, z, t, delta):
    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(z)), t)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("n, k, z, delta", [(1000, 100, 1.0, 1e-5), (60, 6, 2.5, 1e-3), (500, 500, 0.8, 1e-6)])
def test_the_per_round_epsilon_is_the_accountants(n, k, z, delta):
    curve = [epsilon_after(n, k, z, t, delta) for t in range(1, 41)]
    for t in (1, 7, 40):
        assert curve[t - 1] == pytest.approx(reference(n, k, z, t, delta), rel=1e-9)
    assert np.all(np.diff(curve) > 0) and np.isinf(epsilon_after(n, k, 0.0, 3, delta))


def test_the_calibrated_noise_is_the_least_that_meets_the_target():
    z = calibrated_noise(1000, 100, 30, 2.0, 1e-5)
    assert reference(1000, 100, z, 30, 1e-5) <= 2.0 < reference(1000, 100, 0.995 * z, 30, 1e-5)
    with pytest.raises(ValueError, match="no noise multiplier up to 1e4"):
        calibrated_noise(10, 10, 10**6, 1e-9, 1e-9)
