"""`tm.compile_once` on a UNet-style network (issue 40): chains of identical residual blocks.

A UNet of `--levels` resolutions with `--blocks` residual blocks per level on the way down and on
the way up (3x3 convolutions, ReLU, a skip connection), strided convolutions between levels and
transposed ones back, one SGD step on a mean squared error. The blocks of one level form a chain
of identical calls, which `compile_once` rolls into one loop. Each contender runs in a fresh
process per round (with and without the decorator); each prints lower and compile time (wall
and CPU), loops, loss and the median step.

    python -m benchmarks.experiments.unet_compile_once [--levels 3 --blocks 4 --channels 8
        --size 32 --batch 2 --rounds 2 --steps 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import jax
import jax.numpy as jnp

import treemod as tm
import treemod.nn as nn
from benchmarks.experiments.compile_once import first_call_and_steps


class ResBlock(tm.Module):
    conv1: nn.Conv2d
    conv2: nn.Conv2d

    def __init__(self, c: int, *, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, channels_last=True, key=k1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, channels_last=True, key=k2)

    @tm.compile_once
    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.conv2(jax.nn.relu(self.conv1(jax.nn.relu(x))))


class UNet(tm.Module):
    stem: nn.Conv2d
    down: list[list[ResBlock]]
    pools: list[nn.Conv2d]
    ups: list[nn.ConvTranspose2d]
    merges: list[nn.Conv2d]
    up: list[list[ResBlock]]
    head: nn.Conv2d

    def __init__(self, levels: int, blocks: int, c: int, *, key: jax.Array) -> None:
        keys = iter(jax.random.split(key, 4 * levels * (blocks + 2) + 2))
        widths = [c * 2**i for i in range(levels)]
        self.stem = nn.Conv2d(1, c, 3, padding=1, channels_last=True, key=next(keys))
        self.down = [[ResBlock(w, key=next(keys)) for _ in range(blocks)] for w in widths]
        self.pools = [
            nn.Conv2d(a, b, 2, stride=2, channels_last=True, key=next(keys))
            for a, b in zip(widths, widths[1:], strict=False)
        ]
        self.ups = [
            nn.ConvTranspose2d(b, a, 2, stride=2, channels_last=True, key=next(keys))
            for a, b in zip(widths, widths[1:], strict=False)
        ]
        self.merges = [
            nn.Conv2d(2 * a, a, 1, channels_last=True, key=next(keys)) for a in widths[:-1]
        ]
        self.up = [[ResBlock(w, key=next(keys)) for _ in range(blocks)] for w in widths[:-1]]
        self.head = nn.Conv2d(c, 1, 1, channels_last=True, key=next(keys))

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.stem(x)
        skips = []
        for level, blocks in enumerate(self.down):
            for block in blocks:
                h = block(h)
            if level < len(self.pools):
                skips.append(h)
                h = self.pools[level](h)
        for level in reversed(range(len(self.up))):
            h = self.merges[level](jnp.concatenate([self.ups[level](h), skips[level]], -1))
            for block in self.up[level]:
                h = block(h)
        return self.head(h)


def measure(args: argparse.Namespace, once: bool) -> dict[str, Any]:
    if not once:
        ResBlock.__call__ = ResBlock.__call__.__wrapped__  # type: ignore[attr-defined,method-assign]
    model = UNet(args.levels, args.blocks, args.channels, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (args.batch, args.size, args.size, 1))

    @tm.filter_jit
    def step(model: UNet, x: jax.Array) -> tuple[UNet, jax.Array]:
        loss, grads = tm.filter_value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        return jax.tree.map(lambda p, g: p - 1e-2 * g, model, grads), loss

    record, (_, loss) = first_call_and_steps(step, (model, x), args.steps)
    return {"contender": "treemod" if once else "treemod-off", **record, "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, default in [("levels", 3), ("blocks", 4), ("channels", 8), ("size", 32)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, default in [("batch", 2), ("rounds", 2), ("steps", 10)]:
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--worker", choices=["on", "off"], default=None)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args, args.worker == "on")), flush=True)
        return
    for _ in range(args.rounds):
        for mode in ("on", "off"):
            cmd = [sys.executable, "-m", "benchmarks.experiments.unet_compile_once"]
            cmd += sys.argv[1:] + ["--worker", mode]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            print(done.stdout.strip() or done.stderr[-1500:], flush=True)


if __name__ == "__main__":
    main()
