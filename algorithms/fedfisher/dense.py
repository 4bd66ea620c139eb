"""DENSE (Zhang et al. 2022), data-free distillation, as the FedFisher paper's `algs/dense.py` runs it (App. D.3).

Each epoch a freshly initialized DCGAN-style generator and its latent batch z are trained to produce inputs that
the p-weighted logit ensemble of the local models classifies as random targets while the student disagrees with
it; the best batch joins an image pool, and the student (started at FedAvg) is distilled on the whole pool with a
temperature-T KL loss. The generator's BatchNorm-statistics loss is 0 for the paper's BatchNorm-free models.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

Forward = Callable[[torch.Tensor], torch.Tensor]


class Generator(nn.Module):
    """The reference's generator: Linear(nz) -> (2 ngf, s/4, s/4), two x2 upsampling conv blocks, a sigmoid image."""

    def __init__(self, nz: int, ngf: int, image_shape: tuple[int, int, int]):
        super().__init__()
        c, h, w = image_shape
        if h != w or h % 4:
            raise ValueError(f"DENSE generator: needs square images with a side divisible by 4, got {h}x{w}")
        self.init_size = h // 4
        self.l1 = nn.Linear(nz, 2 * ngf * self.init_size**2)
        self.conv_blocks = nn.Sequential(
            nn.BatchNorm2d(2 * ngf), nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False), nn.BatchNorm2d(2 * ngf), nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False), nn.BatchNorm2d(ngf), nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, c, 3, padding=1), nn.Sigmoid(),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.l1(z)
        return self.conv_blocks(out.view(len(out), -1, self.init_size, self.init_size))


def reset(generator: nn.Module, g: torch.Generator) -> None:
    """The reference's `reset_model`: weights N(0, 0.02), BatchNorm scales N(1, 0.02), biases 0."""
    for m in generator.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d, nn.BatchNorm2d)):
            nn.init.normal_(m.weight, 1.0 if isinstance(m, nn.BatchNorm2d) else 0.0, 0.02, generator=g)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def kldiv(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
          reduction: str = "batchmean") -> torch.Tensor:
    """T² KL(softmax(targets/T) ‖ softmax(logits/T)), the reference's distillation loss."""
    q = F.log_softmax(logits / temperature, dim=1)
    return F.kl_div(q, F.softmax(targets / temperature, dim=1), reduction=reduction) * temperature**2


def flip(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Each image mirrored left-right with probability 1/2."""
    mask = (torch.rand(len(x), generator=g) < 0.5).to(x.device)
    return torch.where(mask[:, None, None, None], x.flip(-1), x)


def augment(x: torch.Tensor, g: torch.Generator, padding: int = 4) -> torch.Tensor:
    """The synthesizer's global view: a per-image random crop of the zero-padded image, then a random flip."""
    n, c, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    dy, dx = (torch.randint(0, 2 * padding + 1, (2, n), generator=g)).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    crop = padded[torch.arange(n, device=x.device)[:, None, None, None], torch.arange(c, device=x.device)[None, :, None, None],
                  rows, cols]
    return flip(crop, g)


def synthesize(teacher: Forward, student: Forward, generator: Generator, nz: int, num_classes: int, batch: int,
               iterations: int, lr: float, oh: float, adv: float, g: torch.Generator) -> torch.Tensor:
    """One epoch's synthetic batch: Adam on (generator, z) against oh·CE(teacher, targets) + adv·L_adv, where
    L_adv = −mean(mask · KL(teacher ‖ student)) on the images the two disagree on; the best batch seen, as 8-bit."""
    device = next(generator.parameters()).device
    dtype = next(generator.parameters()).dtype
    reset(generator, g)
    z = torch.randn(batch, nz, generator=g, dtype=dtype).to(device).requires_grad_(True)
    targets = torch.randint(0, num_classes, (batch,), generator=g).sort()[0].to(device)
    groups: list[dict[str, Any]] = [{"params": generator.parameters()}, {"params": [z]}]
    opt = torch.optim.Adam(groups, lr, betas=(0.5, 0.999))
    best: torch.Tensor | None = None
    best_loss = float("inf")
    for _ in range(iterations):
        opt.zero_grad()
        images = generator(z)
        view = augment(images, g).flatten(1)
        t_out, s_out = teacher(view), student(view)
        mask = (s_out.argmax(1) != t_out.argmax(1)).to(dtype)
        loss_adv = -(kldiv(s_out, t_out, reduction="none").sum(1) * mask).mean()
        loss = oh * F.cross_entropy(t_out, targets) + adv * loss_adv
        if best is None or loss.item() < best_loss:
            best, best_loss = images.detach(), loss.item()
        loss.backward()
        opt.step()
    assert best is not None, "synthesize needs iterations >= 1"
    return torch.round(best.clamp(0, 1) * 255) / 255  # the pool stores PNGs


def distill(student: nn.Module, teacher: Forward, pool: torch.Tensor, opt: torch.optim.Optimizer, batch: int,
            temperature: float, g: torch.Generator) -> int:
    """One pass over the shuffled, randomly flipped pool: student steps on the temperature-T KL to the teacher.
    Returns the number of steps."""
    order = torch.randperm(len(pool), generator=g).to(pool.device)
    steps = 0
    for start in range(0, len(pool), batch):
        images = flip(pool[order[start:start + batch]], g).flatten(1)
        with torch.no_grad():
            t_out = teacher(images)
        opt.zero_grad()
        kldiv(student(images), t_out, temperature).backward()
        opt.step()
        steps += 1
    return steps
