"""What a fixed vmapped width costs CNN clients on this CPU: the time of one local step per client at the width
raysim takes (raysim.training.vmapped.vmap_width) against one call of the shard's k clients (the fastest, but a
client's bits then change with k) and one client at a time, for shards of 1, 5 and 128 clients.

    python benchmarks/vmapped.py [--repeats 3]

Prints a table of microseconds a client-step and the ratios raysim's width / one call; one torch thread, as a
client actor runs. Not a timed test: the ratios are what to read.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from raysim.contract import Context
from raysim.models import ModelConfig
from raysim.training import LocalSGD, LocalSGDParams

MODELS = [  # (channels, image shape): tiny, the default `cnn` on digits, LeNet-sized, CIFAR-sized
    ([8, 8], (1, 8, 8)), ([16, 32], (1, 8, 8)), ([6, 16], (1, 28, 28)), ([32, 64], (3, 16, 16)), ([32, 64], (3, 32, 32))]
SHARDS = (1, 5, 128)
BATCH = 10


def per_client_us(algo: LocalSGD, k: int, width: int, repeats: int) -> float:
    """Median microseconds a client of one step of k clients at `width` clients a call."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(k, algo.spec.size, generator=g) * 0.1
    x = torch.randn(k, BATCH, math.prod(algo.ctx.feature_shape), generator=g)
    y, w = torch.randint(0, 10, (k, BATCH), generator=g), torch.ones(k, BATCH)
    chosen, algo._vgrad.width = algo._vgrad.width, width
    try:
        algo.batch_grads(theta, x, y, w)  # warm: the kernels' first call
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            algo.batch_grads(theta, x, y, w)
            times.append(time.perf_counter() - t)
    finally:
        algo._vgrad.width = chosen
    return float(np.median(times)) / k * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | width | " + " | ".join(f"k={k}: width / one call / one at a time (us)" for k in SHARDS)
          + " | " + " | ".join(f"k={k}: width / one call" for k in SHARDS) + " |")
    print("|---|---:|" + "---:|" * (2 * len(SHARDS)))
    for channels, image in MODELS:
        ctx = Context(seed=0, rounds=1, clients_per_round=1000, num_clients=1000, client_sizes=np.full(1000, BATCH),
                      feature_shape=(math.prod(image),), image_shape=image, num_classes=10,
                      model=ModelConfig(name="cnn", channels=channels), params=LocalSGDParams(batch_size=BATCH))
        algo = LocalSGD(ctx)
        width = algo._vgrad.width
        cells, ratios = [], []
        for k in SHARDS:
            ours, whole, alone = (per_client_us(algo, k, w, args.repeats) for w in (width, k, 1))
            cells.append(f"{ours:.0f} / {whole:.0f} / {alone:.0f}")
            ratios.append(f"{ours / whole:.2f}x")
        print(f"| {channels} on {'x'.join(map(str, image))} | {width} | " + " | ".join(cells) + " | "
              + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
