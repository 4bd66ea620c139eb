"""Black-box objectives built on data and small torch models (the FZooS paper).

* `MetricObjective`: f_i(u) = 1 - metric (macro precision, recall, F1 or Jaccard) of a pretrained
  classifier whose parameters are perturbed by r(2u - 1), on client i's class-skewed rows. The
  classifier is pretrained on the held-out split (test.parquet), which plays the paper's
  "training half"; the clients' rows are its "test half".
* `AttackObjective`: one perturbation r(2u - 1) of an image; f_i(u) is the margin (true logit
  minus the best other logit) of client i's own model, trained on its class-skewed rows. The
  image is the k-th held-out image (in a seeded order) with a positive mean margin at zero
  perturbation (the official code's criterion: with class-skewed clients few images are
  classified correctly by every model); the attack succeeds when F = mean margin < 0 (the official code's criterion).

Every process builds the same objective: models are trained full-batch, in float64, on one
thread, from seeded initial parameters.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, vmap

from raysim.algorithms.fzoos.objectives import Objective
from raysim.contract import Context
from raysim.core.rng import SERVER, SETUP, stream
from raysim.data import read_clients, read_table_arrays
from raysim.errors import ConfigError
from raysim.models import ParamSpec, build_model, initial_vector


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread (results then do not depend on the actor's thread count)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def held_out_path(ctx: Context) -> Path:
    """The server's held-out split, written beside the clients' train.parquet (raysim.data.federated)."""
    assert ctx.train_path is not None, "a run's Context names its train.parquet"
    return Path(ctx.train_path).with_name("test.parquet")


class Classifier:
    """A model of the `model:` section as a function of one flat float64 parameter vector."""

    def __init__(self, ctx: Context):
        self.module = build_model(ctx.model, ctx.feature_shape, ctx.image_shape, ctx.num_classes).double()
        self.spec = ParamSpec.of(self.module)
        self.ctx = ctx

    def logits(self, theta: Tensor, x: Tensor) -> Tensor:
        """Logits of inputs x under parameters theta (size,) -> (n, C), or theta (k, size) -> (k, n, C)."""
        if theta.dim() == 1:
            return functional_call(self.module, self.spec.unflatten(theta), (x,))
        return vmap(lambda th: functional_call(self.module, self.spec.unflatten(th), (x,)))(theta)

    def train(self, x: Tensor, y: Tensor, seed: int, steps: int, lr: float) -> Tensor:
        """Full-batch Adam on the cross-entropy from the seeded initial parameters; returns theta."""
        c = self.ctx
        theta = torch.tensor(initial_vector(c.model, c.feature_shape, c.image_shape, c.num_classes, seed),
                             dtype=torch.float64, requires_grad=True)
        opt = torch.optim.Adam([theta], lr=lr)
        with one_thread():
            for _ in range(steps):
                opt.zero_grad()
                F.cross_entropy(self.logits(theta, x), y).backward()
                opt.step()
        return theta.detach()


def _client_rows(ctx: Context) -> list[tuple[Tensor, Tensor]]:
    assert ctx.train_path is not None, "a run's Context names its train.parquet"
    rows = read_clients(ctx.train_path, range(ctx.num_clients))
    return [(torch.tensor(np.asarray(x), dtype=torch.float64), torch.tensor(np.asarray(y)))
            for x, y in (rows[i] for i in range(ctx.num_clients))]


def _int_seed(seed: int, client: int, purpose: str) -> int:
    return int(stream(seed, SETUP, client, purpose).integers(2**31))


def macro_scores(pred: Tensor, y: Tensor, num_classes: int, metric: str) -> Tensor:
    """Macro-averaged precision/recall/F1/Jaccard of predictions (k, n) against labels (n,): (k,).

    As scikit-learn: averaged over the classes present in the labels or the predictions, a class
    with a zero denominator scoring 0.
    """
    classes = torch.arange(num_classes)[:, None, None]
    p, t = pred[None] == classes, (y[None, None] == classes)
    tp = (p & t).sum(-1).double()
    fp = (p & ~t).sum(-1).double()
    fn = (~p & t).sum(-1).double()
    num, den = {"precision": (tp, tp + fp), "recall": (tp, tp + fn), "f1": (2 * tp, 2 * tp + fp + fn),
                "jaccard": (tp, tp + fp + fn)}[metric]
    score = torch.where(den > 0, num / den.clamp_min(1.0), torch.zeros_like(num))
    present = ((tp + fp + fn) > 0).double()
    return (score * present).sum(0) / present.sum(0)


class MetricObjective(Objective):
    """Federated non-differentiable metric optimisation (Sec. 6.3): minimise 1 - metric of theta* + r(2u - 1)."""

    def __init__(self, ctx: Context, metric: str, perturbation: float, pretrain_steps: int, pretrain_lr: float):
        self.net = Classifier(ctx)
        self.metric, self.radius, self.num_classes = metric, perturbation, ctx.num_classes
        hx, hy = read_table_arrays(held_out_path(ctx))
        if len(hy) == 0:
            raise ConfigError("algorithm.objective: the metric objective pretrains on the held-out split; "
                             "data.test_fraction leaves it empty")
        self.theta = self.net.train(torch.tensor(np.asarray(hx), dtype=torch.float64), torch.tensor(np.asarray(hy)),
                                    _int_seed(ctx.seed, SERVER, "zo_metric_init"), pretrain_steps, pretrain_lr)
        self.clients = _client_rows(ctx)
        self.dim, self.num_clients = self.net.spec.size, ctx.num_clients
        self.x0 = torch.full((self.dim,), 0.5, dtype=torch.float64)

    def local(self, i: int, u: Tensor) -> Tensor:
        x, y = self.clients[i]
        with torch.no_grad(), one_thread():
            pred = self.net.logits(self.theta + self.radius * (2.0 * u - 1.0), x).argmax(-1)
        return 1.0 - macro_scores(pred, y, self.num_classes, self.metric)


class AttackObjective(Objective):
    """Federated black-box adversarial attack (Sec. 6.2): minimise the mean margin over the client models."""

    def __init__(self, ctx: Context, perturbation: float, image: int, train_steps: int, train_lr: float,
                 start: str):
        self.net = Classifier(ctx)
        self.radius = perturbation
        clients = _client_rows(ctx)
        self.models = [self.net.train(x, y, _int_seed(ctx.seed, i, "zo_attack_init"), train_steps, train_lr)
                       for i, (x, y) in enumerate(clients)]
        data = torch.cat([x for x, _ in clients])
        self.lo, self.hi = float(data.min()), float(data.max())
        held_x, held_y = read_table_arrays(held_out_path(ctx))
        hx, hy = torch.tensor(np.asarray(held_x), dtype=torch.float64), torch.tensor(np.asarray(held_y))
        self.dim, self.num_clients = hx[0].numel(), ctx.num_clients
        zero = torch.full((self.dim,), 0.5, dtype=torch.float64)
        margins = torch.stack([self._margins(i, zero, hx, hy) for i in range(self.num_clients)]).mean(0)
        order = stream(ctx.seed, SETUP, SERVER, "zo_attack_image").permutation(len(hy))
        valid = [int(j) for j in order if margins[j] > 0]
        if image >= len(valid):
            raise ConfigError(f"algorithm.objective.image: {image} but only {len(valid)} held-out images have a "
                             "positive mean margin over the client models")
        self.image, self.label = hx[valid[image]], hy[valid[image]]
        self.x0 = torch.full((self.dim,), 0.5 if start == "zero" else 0.0, dtype=torch.float64)

    def _margins(self, i: int, u: Tensor, images: Tensor, labels: Tensor) -> Tensor:
        """Margins of client i's model on images + r(2u - 1), clamped to the data's range."""
        z = (images.reshape(len(images), -1) + self.radius * (2.0 * u - 1.0)).clamp(self.lo, self.hi)
        with torch.no_grad(), one_thread():
            logits = self.net.logits(self.models[i], z.reshape(-1, *images.shape[1:]))
        true = logits.gather(1, labels.reshape(-1, 1).expand(len(z), 1))[:, 0]
        others = logits.scatter(1, labels.reshape(-1, 1).expand(len(z), 1), -torch.inf)
        return true - others.max(-1).values

    def local(self, i: int, u: Tensor) -> Tensor:
        return self._margins(i, u, self.image[None], self.label.reshape(1))
