"""The workloads: one architecture each, written once per framework, with expected sizes.

Every framework module in this package builds these models from a `Workload` and must reach the
parameter count given by `expected_params`; the worker asserts it, so all frameworks train the
same architecture. `suite` adds the DARTS supernet, whose bilevel step each library writes in
`darts_<framework>.py`. This module imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from . import darts_spec

Kind = Literal["mlp", "resnet", "transformer", "darts"]

FRAMEWORKS = ("jax", "treemod", "equinox", "nnx", "nnx_tree", "linen", "haiku")
"""Contender names, the floor (plain JAX on dicts) first."""

LABELS = {
    "jax": "plain JAX",
    "treemod": "treemod",
    "equinox": "Equinox",
    "nnx": "Flax NNX",
    "nnx_tree": "Flax NNX (tree mode)",
    "linen": "Flax Linen",
    "haiku": "Haiku",
}

# The Python packages each framework needs (import names).
REQUIRES = {
    "jax": ("jax", "optax"),
    "treemod": ("jax", "optax", "treemod"),
    "equinox": ("jax", "optax", "equinox"),
    "nnx": ("jax", "optax", "flax.nnx"),
    "nnx_tree": ("jax", "optax", "flax.nnx"),
    "linen": ("jax", "optax", "flax.linen"),
    "haiku": ("jax", "optax", "haiku"),
}

# Their distributions, for the install hint and the version record.
DISTRIBUTIONS = {
    "treemod": "treemod",
    "equinox": "equinox",
    "nnx": "flax",
    "nnx_tree": "flax",
    "linen": "flax",
    "haiku": "dm-haiku",
}

LEARNING_RATE = 1e-3  # optax.adam(LEARNING_RATE) everywhere
BN_MOMENTUM = 0.1  # PyTorch convention: running = 0.9 * running + 0.1 * batch (Flax 0.9)
BN_EPS = 1e-5
LN_EPS = 1e-5


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark model and its batch sizes.

    `depth` is the number of hidden layers (MLP) or transformer blocks; `widths`/`blocks` describe
    the ResNet stages. `tiny_batch` makes the step dispatch-bound, `big_batch` is a realistic one
    (0: none). The DARTS supernet keeps its `DartsConfig` in `depth` (cells), `width` (channels),
    `image`, `classes` and `tiny_batch` (its one batch): see `darts_config`.
    """

    name: str
    kind: Kind
    title: str
    depth: int = 0
    width: int = 0
    classes: int = 10
    heads: int = 0
    seq: int = 0
    vocab: int = 0
    mlp_ratio: int = 4
    dropout: float = 0.0
    scan: bool = False
    image: int = 32
    widths: tuple[int, ...] = ()
    blocks: tuple[int, ...] = ()
    tiny_batch: int = 1
    big_batch: int = 8

    @property
    def random(self) -> bool:
        """Whether a training step draws random numbers (dropout); if not, no key is split."""
        return self.dropout > 0


def _transformer(name: str, title: str, depth: int, scan: bool, quick: bool) -> Workload:
    if quick:
        return Workload(
            name, "transformer", title, depth=max(2, depth // 8), width=16, heads=2, seq=8,
            vocab=32, dropout=0.1, scan=scan, tiny_batch=1, big_batch=4,
        )  # fmt: skip
    return Workload(
        name, "transformer", title, depth=depth, width=256, heads=4, seq=128, vocab=1024,
        dropout=0.1, scan=scan, tiny_batch=1, big_batch=8,
    )  # fmt: skip


def workloads(quick: bool = False) -> dict[str, Workload]:
    """The model workloads (those a framework module's `build` makes) by name, at full size or
    (`quick`) at a tiny size for smoke runs."""
    if quick:
        mlp = dict(width=16, tiny_batch=2, big_batch=32)
        resnet = dict(widths=(4, 8, 8, 16), blocks=(1, 1, 1, 1), image=8, tiny_batch=2, big_batch=8)
    else:
        mlp = dict(width=256, tiny_batch=8, big_batch=512)
        resnet = dict(
            widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), image=32, tiny_batch=2, big_batch=32
        )
    items = [
        Workload("mlp8", "mlp", "MLP, depth 8", depth=8, **mlp),  # type: ignore[arg-type]
        Workload("mlp64", "mlp", "MLP, depth 64", depth=64, **mlp),  # type: ignore[arg-type]
        Workload("resnet18", "resnet", "ResNet-18 + BatchNorm (train)", **resnet),  # type: ignore[arg-type]
        _transformer("transformer12", "Transformer, 12 layers", 12, False, quick),
        _transformer("stack4_scan", "4 blocks, scan", 4, True, quick),
        _transformer("stack48_scan", "48 blocks, scan", 48, True, quick),
        _transformer("stack48_unrolled", "48 blocks, unrolled", 48, False, quick),
    ]
    return {w.name: w for w in items}


DARTS_SIZES = {"small": darts_spec.DartsConfig.small, "tiny": darts_spec.DartsConfig.tiny}
"""The DARTS supernet's sizes the suite runs (the worker setting `darts_size`)."""


def darts_workload(size: str) -> Workload:
    """The DARTS supernet's bilevel step at `size` (a key of `DARTS_SIZES`) as a workload.

    Raises ValueError naming the sizes when `size` is not one.
    """
    if size not in DARTS_SIZES:
        raise ValueError(f"darts_size {size!r} is not one of {', '.join(map(repr, DARTS_SIZES))}")
    cfg = DARTS_SIZES[size]()
    return Workload(
        "darts", "darts", "DARTS supernet, bilevel step", depth=cfg.cells, width=cfg.channels,
        classes=cfg.classes, image=cfg.image, tiny_batch=cfg.batch, big_batch=0,
    )  # fmt: skip


def darts_config(w: Workload) -> darts_spec.DartsConfig:
    """The `DartsConfig` of a DARTS workload."""
    return darts_spec.DartsConfig(
        channels=w.width, cells=w.depth, batch=w.tiny_batch, image=w.image, classes=w.classes
    )


def suite(quick: bool = False, darts_size: str | None = None) -> dict[str, Workload]:
    """The suite's workloads by name: `workloads(quick)` and the DARTS supernet, whose step
    is each library's `darts_<framework>.make_step` (its size: `darts_size`, by default "tiny"
    when `quick`, else "small")."""
    size = darts_size or ("tiny" if quick else "small")
    return {**workloads(quick), "darts": darts_workload(size)}


def describe(w: Workload) -> str:
    """A one-line description of the architecture, for the report."""
    if w.kind == "mlp":
        return f"MLP {w.depth} hidden x {w.width}, in {w.width}, out {w.classes}, ReLU"
    if w.kind == "darts":
        cfg = darts_config(w)
        return (
            f"DARTS search network, {cfg.cells} cells (C={cfg.channels}, 14 mixed edges of 8 "
            f"operations each), {cfg.image}x{cfg.image}x3 -> {cfg.classes}, batch {cfg.batch}; "
            "one first-order bilevel step: Adam on the architecture (validation batch), SGD "
            "with momentum on the weights (training batch)"
        )
    if w.kind == "resnet":
        return (
            f"ResNet ({'-'.join(map(str, w.blocks))} basic blocks, widths "
            f"{'-'.join(map(str, w.widths))}), BatchNorm in training mode, "
            f"{w.image}x{w.image}x3 -> {w.classes}"
        )
    how = "scan over layers" if w.scan else "unrolled"
    return (
        f"pre-LN Transformer encoder, {w.depth} blocks ({how}), width {w.width}, {w.heads} heads, "
        f"MLP {w.mlp_ratio * w.width}, seq {w.seq}, dropout {w.dropout}"
    )


def expected_params(w: Workload) -> int:
    """The number of trainable parameters every framework's model must have."""
    if w.kind == "mlp":
        d, c = w.width, w.classes
        return (d * d + d) + (w.depth - 1) * (d * d + d) + (d * c + c)
    if w.kind == "darts":
        return darts_spec.expected_params(darts_config(w))
    if w.kind == "resnet":
        total = 3 * 3 * 3 * w.widths[0] + 2 * w.widths[0]  # stem conv (no bias) + BN
        cin = w.widths[0]
        for stage, (cout, n) in enumerate(zip(w.widths, w.blocks, strict=True)):
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                total += 9 * cin * cout + 2 * cout + 9 * cout * cout + 2 * cout
                if stride != 1 or cin != cout:
                    total += cin * cout + 2 * cout
                cin = cout
        return total + cin * w.classes + w.classes
    d, h = w.width, w.mlp_ratio * w.width
    block = 2 * d + 4 * (d * d + d) + 2 * d + (d * h + h) + (h * d + d)
    return w.vocab * d + w.seq * d + w.depth * block + 2 * d + d * w.classes + w.classes


def block_strides(w: Workload) -> list[tuple[int, int, int]]:
    """(in_channels, out_channels, stride) of each ResNet basic block, in order."""
    out = []
    cin = w.widths[0]
    for stage, (cout, n) in enumerate(zip(w.widths, w.blocks, strict=True)):
        for b in range(n):
            out.append((cin, cout, 2 if (stage > 0 and b == 0) else 1))
            cin = cout
    return out
