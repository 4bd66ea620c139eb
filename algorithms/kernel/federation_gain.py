"""Federation gain (the kernel FedAvg/FedProx paper): empirical per-client gain and the
theoretical lower bounds of Theorems 5 and 6.

Empirical (Def. 1, Figs 4-5): FG_j = ||theta_loc_j - theta_j*|| / ||theta_FL - theta_j*||, a ratio of
unsquared l2 (= RKHS) errors, where theta_loc_j = pinv(Phi_j) y_j is client j's min-norm least
squares and theta_FL the converged federated model (`fixed_point` of the algorithm family).
The threshold FG = 1 is the same for the squared ratio (`squared=True`).

The bounds hold up to the unknown absolute constant c1 (default 1); use them for shape
(decreasing in Gamma, thresholds, scaling in N, r_j), not as numbers.
"""
from __future__ import annotations

import numpy as np


def local_estimator(Phi: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Client j's local benchmark: the min-norm least squares pinv(Phi_j) y_j (minimax-optimal, [Mou19])."""
    return np.linalg.pinv(np.asarray(Phi, dtype=np.float64)) @ np.asarray(y, dtype=np.float64)


def empirical_gain(theta_local: np.ndarray, theta_fl: np.ndarray, theta_star: np.ndarray,
                   squared: bool = False) -> float:
    """||theta_local - theta*|| / ||theta_FL - theta*|| (squared: the ratio of squares)."""
    num = float(np.linalg.norm(theta_local - theta_star))
    den = float(np.linalg.norm(theta_fl - theta_star))
    g = num / den if den > 0 else np.inf
    return g * g if squared else g


def federation_gains(Phis, ys, theta_fl: np.ndarray, theta_stars, squared: bool = False) -> np.ndarray:
    """The empirical FG of every client j: local min-norm LS against the federated model theta_fl."""
    return np.array([empirical_gain(local_estimator(P, y), theta_fl, ts, squared)
                     for P, y, ts in zip(Phis, ys, theta_stars)])


def local_risk_gaussian(theta_star: np.ndarray, n: int, sigma: float) -> float:
    """E||pinv(X) y - theta*||^2 for X of n i.i.d. N(0, I_d) rows and N(0, sigma^2) noise (Sec. 6.2's set-up):
    (1 - n/d)||theta*||^2 + sigma^2 n/(d - n - 1) for n < d - 1 (the min-norm solution misses the part
    of theta* off a uniformly random n-dim row space; the noise term is E tr((X X')^-1)), and
    sigma^2 d/(n - d - 1) for n > d + 1 (OLS)."""
    d = len(theta_star)
    if n < d - 1:
        return (1.0 - n / d) * float(theta_star @ theta_star) + sigma ** 2 * n / (d - n - 1)
    if n > d + 1:
        return sigma ** 2 * d / (n - d - 1)
    raise ValueError(f"the Gaussian local risk is infinite for n = {n} within one of d = {d}")


def gain_gaussian(theta_stars: np.ndarray, sizes, j: int, sigma: float) -> float:
    """Closed-form FG_j of the Fig. 4 model (Gaussian covariates, truths theta_i*): sqrt(local_risk_gaussian /
    (||sum_i w_i theta_i* - theta_j*||^2 + sigma^2 d/(N - d - 1))), w_i = n_i/N. The denominator is the
    pooled-OLS (FedAvg s = 1) risk, exact in expectation at Gamma = 0; for Gamma > 0 it replaces the
    matrix-weighted average of the truths (Thm 4's limit) by the sample-weighted one."""
    sizes = np.asarray(sizes, dtype=np.float64)
    N, d = float(sizes.sum()), theta_stars.shape[1]
    gap = (sizes / N) @ theta_stars - theta_stars[j]
    federated = float(gap @ gap) + sigma ** 2 * d / (N - d - 1)
    return float(np.sqrt(local_risk_gaussian(theta_stars[j], int(sizes[j]), sigma) / federated))


def local_risk_lower(n_j: float, d: float, sigma: float, B: float) -> float:
    """R^Loc_j lower bound (up to c): min(sigma^2 d/n_j, B^2) + max(1 - n_j/d, 0) B^2."""
    return min(sigma ** 2 * d / n_j, B ** 2) + max(1.0 - n_j / d, 0.0) * B ** 2


def fg_bound_thm5(n_j: float, d: float, N: float, sigma: float, B: float, Gamma: float,
                  kappa: float = 1.0, c1: float = 1.0) -> float:
    """Theorem 5 (32): FG_j >= (c1/kappa) [min(s^2 d/n_j, B^2) + max(1 - n_j/d, 0) B^2] / (s^2 d/N + Gamma^2)."""
    return c1 / kappa * local_risk_lower(n_j, d, sigma, B) / (sigma ** 2 * d / N + Gamma ** 2)


def fg_bound_thm6(n_j: float, r_j: float, d: float, N: float, sigma: float, B: float,
                  kappa: float = 1.0, c1: float = 1.0) -> float:
    """Theorem 6 (33), subspace model: (c1/kappa) [min(s^2 d/n_j, B^2) + (1 - r_j/d) B^2] / (s^2 d/N).

    Valid only when N >= C nu d log d (coverage); below it FL cannot estimate f* at all.
    """
    return c1 / kappa * (min(sigma ** 2 * d / n_j, B ** 2) + (1.0 - r_j / d) * B ** 2) / (sigma ** 2 * d / N)


def gamma_threshold(n_j: float, d: float, sigma: float, B: float) -> float:
    """The Gamma below which Thm 5 guarantees FG_j > 1: B sqrt(1 - n_j/d) for a data-scarce client
    (n_j < d), min(sigma sqrt(d/n_j), B) for a data-rich one."""
    if n_j < d:
        return B * float(np.sqrt(1.0 - n_j / d))
    return min(sigma * float(np.sqrt(d / n_j)), B)


def coverage_threshold(d: int, nu: float = 1.0) -> float:
    """N at which Thm 6's gain jumps (coupon collecting): nu d log d."""
    return nu * d * float(np.log(d))
