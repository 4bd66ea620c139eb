"""FedFisher's synthetic two-layer ReLU experiment (Fig. 1; the FedFisher paper), numpy float64.

Model (eq. (8), App. D.1): f(W, x) = Σ_r a_r ReLU(w_r·x) with fixed a_r = ±1/√m (the 1/√m folded into a) and the
trained first layer W ∈ R^{m×p}, vectorised row-major, vec(W) = (w_1, ..., w_m). By ReLU homogeneity
f(W, x) = φ(W, x)·vec(W) with φ(W, x) = [a_r x 1{w_r·x ≥ 0}]_r = ∇_W f (Claim 1, App. B).

Normalisation (Sec. 3, App. B and D.1):
* local loss L_i(W) = (1/n) Σ_j ½ (f(W, x_ij) − y_ij)², eq. (1) with ℓ(z, y) = ½(y − z)² (Sec. 3);
* full Fisher of client i (Claim 2), at its *local* model W̃_i: F_i = (1/n) Σ_j φ_ij φ_ijᵀ, φ_ij = φ(W̃_i, x_ij);
* server objective of Alg. 1 / Lemma 1, unweighted over clients: Φ(W) = ½ Σ_i (W − W̃_i)ᵀ F_i (W − W̃_i), GD with
  step η_S from W̄ = (1/M) Σ_i W̃_i. All clients hold n points, so the code's p_i = n_i/N weights would be 1/M:
  W̄ is the same, and p_i-weighted Fishers would equal this server run with η_S/M;
* metric: (1/N) Σ_ij (f(W, x_ij) − y_ij)² over all N = Mn points, without the ½ (as in Theorem 1's proof).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from raysim.core.rng import SERVER, SETUP, stream

INPUT_DIM = 2
INPUT_COV_DIAG = np.array([1.0, 2.0 ** -1.2])


def make_data(rng: np.random.Generator, clients: int = 2, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Inputs x [M, n, 2] on the unit circle and noise-free targets y [M, n] (App. D.1): per client, scalars
    w_i, b_i ~ N(0, 1), vectors w_i ~ N(w_i 1, I), b_i ~ N(b_i 1, I), x̃ ~ N(b_i, diag(1, 2^-1.2)),
    x = x̃/‖x̃‖, y = w_i·x."""
    xs, ys = [], []
    for _ in range(clients):
        w_mean, b_mean = rng.standard_normal(2)
        w_vec = w_mean + rng.standard_normal(INPUT_DIM)
        b_vec = b_mean + rng.standard_normal(INPUT_DIM)
        raw = b_vec + rng.standard_normal((n, INPUT_DIM)) * np.sqrt(INPUT_COV_DIAG)
        x = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        xs.append(x)
        ys.append(x @ w_vec)
    return np.stack(xs), np.stack(ys)


def init_network(rng: np.random.Generator, width: int, p: int = INPUT_DIM) -> tuple[np.ndarray, np.ndarray]:
    """Fixed second layer a [m] = ±1/√m with probability ½ each and the common initial first layer
    W0 [m, p] with rows w_r ~ N(0, I/2) (App. D.1)."""
    a = rng.choice([-1.0, 1.0], size=width) / math.sqrt(width)
    w0 = rng.standard_normal((width, p)) * math.sqrt(0.5)
    return a, w0


def predict(a: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """f(W, x) = Σ_r a_r ReLU(w_r·x) for inputs x [n, p] (eq. (8))."""
    return np.maximum(x @ w.T, 0.0) @ a


def features(a: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """φ(W, x) [n, m·p]: row j is [a_r x_j 1{w_r·x_j ≥ 0}]_r, the gradient ∇_W f in row-major vec(W) order (Claim 1)."""
    active = (x @ w.T >= 0.0) * a
    return (active[:, :, None] * x[:, None, :]).reshape(len(x), -1)


def local_loss(a: np.ndarray, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """L_i(W) = (1/n) Σ_j ½ (f(W, x_j) − y_j)² (eq. (1), ℓ = ½(y − z)²)."""
    return 0.5 * float(np.mean((predict(a, w, x) - y) ** 2))


def local_gd(a: np.ndarray, w0: np.ndarray, x: np.ndarray, y: np.ndarray, steps: int, lr: float = 0.1) -> np.ndarray:
    """K full-batch GD steps W ← W − η ∇L_i(W) from W0 (Alg. 1, App. D.1); ∇L_i = (1/n) Σ_j (f_j − y_j) φ_j."""
    w = w0.copy()
    xt = np.ascontiguousarray(x.T)
    scale = (lr / len(x)) * a[:, None]
    for _ in range(steps):
        pre = w @ xt
        active = (pre >= 0.0).astype(float)
        resid = a @ (pre * active) - y
        w -= scale * (active @ (resid[:, None] * x))
    return w


def fedavg(local_models: np.ndarray) -> np.ndarray:
    """One-shot FedAvg W̄ = (1/M) Σ_i W̃_i of local models [M, m, p] (equal n, so p_i = 1/M)."""
    return local_models.mean(axis=0)


def proxy_system(a: np.ndarray, local_models: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ã [N, d] stacking φ(W̃_i, x_ij) client by client, and the proxy targets ỹ [N],
    ỹ_ij = Ã_ij·vec(W̃_i) = f(W̃_i, x_ij) (Lemma 6). Then F_i = Ã_iᵀÃ_i/n and b = Σ_i F_i vec(W̃_i) = Ãᵀỹ/n.
    ỹ is formed as Ã_i vec(W̃_i) so that ỹ − Ã W̄ is exactly 0 when all W̃_i are equal."""
    rows = [features(a, w, xi) for w, xi in zip(local_models, x)]
    targets = [r @ w.reshape(-1) for r, w in zip(rows, local_models)]
    return np.concatenate(rows), np.concatenate(targets)


def fedfisher_spectral(a_tilde: np.ndarray, y_tilde: np.ndarray, w_bar: np.ndarray, n: int, steps: float,
                       server_lr: float = 1e-3) -> np.ndarray:
    """vec(W^(T)) of T server GD steps W ← W − η_S Σ_i F_i (W − W̃_i) from W̄, F_i = Ã_iᵀÃ_i/n, in closed form (README):
    W^(T) = W̄ + Vᵀ diag((1 − (1 − η_S s_k²/n)^T)/s_k) Uᵀ (ỹ − Ã W̄) for the SVD Ã = U diag(s) V.
    steps = math.inf gives the minimum-distance solution of eq. (7), W̄ + Ã⁺(ỹ − Ã W̄) = W̄ + F⁺(b − F W̄), with
    singular values at or below the numerical-rank tolerance s_max·max(N, d)·ε (np.linalg.matrix_rank's, lstsq's
    rcond=None) taken as 0. Finite T needs η_S s_max²/n ≤ 1 (Lemma 1: η_S ≤ 1/λ_max(Σ F_i))."""
    if steps < 0:
        raise ValueError(f"steps (T) must be >= 0 or math.inf, got {steps}")
    u, s, vt = np.linalg.svd(a_tilde, full_matrices=False)
    residual = y_tilde - a_tilde @ w_bar.reshape(-1)
    if math.isinf(steps):
        keep = s > s.max() * max(a_tilde.shape) * np.finfo(float).eps
        gain = np.divide(1.0, s, out=np.zeros_like(s), where=keep)
    else:
        shrink = server_lr * s ** 2 / n
        if shrink.max() > 1.0 + 1e-9:
            raise ValueError(f"server_lr={server_lr} exceeds 1/λ_max(Σ F_i) = {server_lr / shrink.max():.4g} (Lemma 1)")
        with np.errstate(divide="ignore"):
            log_keep = np.log1p(-np.minimum(shrink, 1.0))
        decay = -np.expm1(steps * log_keep) if steps > 0 else np.zeros_like(s)
        gain = np.divide(decay, s, out=np.zeros_like(s), where=s > 0)
    return w_bar.reshape(-1) + vt.T @ (gain * (u.T @ residual))


def global_error(a: np.ndarray, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """(1/N) Σ_ij (f(W, x_ij) − y_ij)² over all clients' points (Theorem 1's loss)."""
    return float(np.mean((predict(a, w.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])) - y.reshape(-1)) ** 2))


def method_name(steps: float) -> str:
    """Result key of FedFisher with T server steps: fedfisher_T=10000, fedfisher_T=inf."""
    return f"fedfisher_T={'inf' if math.isinf(steps) else int(steps)}"


def experiment(width: int, steps: int, seed: int, server_steps: Sequence[float] = (1e4, 1e5, math.inf),
               lr: float = 0.1, server_lr: float = 1e-3, clients: int = 2, n: int = 100) -> dict[str, float]:
    """One Fig. 1 point: errors (Theorem 1's loss) of FedAvg, FedFisher for each T in server_steps, and "local_fit",
    (1/N) Σ_ij (f(W̃_i, x_ij) − y_ij)² (each local model on its own data). Data and init come from the streams
    (seed, "fedfisher_synthetic/data" | "/init"), so a seed's data is the same at every width and K."""
    x, y = make_data(stream(seed, SETUP, SERVER, "fedfisher_synthetic/data"), clients, n)
    a, w0 = init_network(stream(seed, SETUP, SERVER, "fedfisher_synthetic/init"), width)
    local_models = np.stack([local_gd(a, w0, xi, yi, steps, lr) for xi, yi in zip(x, y)])
    w_bar = fedavg(local_models)
    a_tilde, y_tilde = proxy_system(a, local_models, x)
    out = {"fedavg": global_error(a, w_bar, x, y),
           "local_fit": float(np.mean([(predict(a, w, xi) - yi) ** 2 for w, xi, yi in zip(local_models, x, y)]))}
    for t in server_steps:
        out[method_name(t)] = global_error(a, fedfisher_spectral(a_tilde, y_tilde, w_bar, n, t, server_lr), x, y)
    return out
