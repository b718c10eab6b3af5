"""The DARTS search network (Liu et al., 2019): configuration and the parameter count.

Every library's supernet (`darts_jax.py`, `darts_treemod.py`, ...) is built from a
`DartsConfig` and must have `expected_params(cfg)` trainable weights (architecture weights
and BatchNorm running statistics excluded). Layout NHWC everywhere. This module imports
nothing heavy.

The network: a stem (3x3 convolution to `3 C` channels, BatchNorm with affine parameters),
`cells` cells of which those at one and two thirds of the depth are reduction cells (stride
2, channels doubled), global average pooling and a linear classifier. A cell preprocesses its
two inputs (ReLU, 1x1 convolution, BatchNorm; a factorized reduce if the previous cell
reduced), then builds `NODES` intermediate nodes, each the sum of one mixed edge per earlier
state (14 edges for 4 nodes), and concatenates the intermediate nodes. A mixed edge is the
softmax-weighted sum of `OPS`; all BatchNorms after the stem have no affine parameters.
Average pooling counts the padding (PyTorch's `count_include_pad=True`, in every library).
"""

from __future__ import annotations

import dataclasses

OPS = (
    "none",
    "max_pool_3x3",
    "avg_pool_3x3",
    "skip_connect",
    "sep_conv_3x3",
    "sep_conv_5x5",
    "dil_conv_3x3",
    "dil_conv_5x5",
)
NODES = 4
STEM_MULTIPLIER = 3
EDGES = sum(2 + i for i in range(NODES))  # 14
W_LR, W_MOMENTUM = 0.025, 0.9  # optax.sgd(W_LR, momentum=W_MOMENTUM) on the weights
A_LR, A_B1, A_B2 = 3e-4, 0.5, 0.999  # optax.adam on the architecture weights
BN_EPS, BN_MOMENTUM = 1e-5, 0.1


@dataclasses.dataclass(frozen=True)
class DartsConfig:
    """Size of the supernet and its batches (`small()`: the issue's C=4, 5 cells, 4x3x16x16)."""

    channels: int = 16
    cells: int = 8
    batch: int = 64
    image: int = 32
    classes: int = 10

    @classmethod
    def small(cls) -> DartsConfig:
        return cls(channels=4, cells=5, batch=4, image=16)

    @classmethod
    def tiny(cls) -> DartsConfig:
        """For tests and short measurements on a loaded machine."""
        return cls(channels=4, cells=2, batch=2, image=8)

    def reductions(self) -> tuple[int, ...]:
        return (self.cells // 3, 2 * self.cells // 3)


def cell_plan(cfg: DartsConfig) -> list[tuple[int, int, int, bool, bool]]:
    """(C_prev_prev, C_prev, C, reduction, reduction_prev) of each cell, in order."""
    c_curr = STEM_MULTIPLIER * cfg.channels
    c_pp, c_p, c = c_curr, c_curr, cfg.channels
    plan, reduction_prev = [], False
    for i in range(cfg.cells):
        reduction = i in cfg.reductions()
        if reduction:
            c *= 2
        plan.append((c_pp, c_p, c, reduction, reduction_prev))
        reduction_prev = reduction
        c_pp, c_p = c_p, NODES * c
    return plan


def edge_strides(reduction: bool) -> list[int]:
    """Stride of each of a cell's 14 mixed edges (2 on edges from the inputs of a reduction)."""
    return [2 if reduction and j < 2 else 1 for i in range(NODES) for j in range(2 + i)]


def _mixed_op_params(c: int, stride: int) -> int:
    """Weights of one mixed edge (pools, zero and identity have none; BatchNorm no affine)."""
    sep = sum(2 * (c * k * k + c * c) for k in (3, 5))  # two depthwise + pointwise pairs
    dil = sum(c * k * k + c * c for k in (3, 5))
    skip = 0 if stride == 1 else 2 * (c * (c // 2))  # factorized reduce
    return sep + dil + skip


def expected_params(cfg: DartsConfig) -> int:
    """Trainable weights of the supernet (no architecture weights, no running statistics)."""
    c_stem = STEM_MULTIPLIER * cfg.channels
    total = 27 * c_stem + 2 * c_stem
    c_last = c_stem
    for c_pp, c_p, c, reduction, reduction_prev in cell_plan(cfg):
        total += 2 * c_pp * (c // 2) if reduction_prev else c_pp * c
        total += c_p * c
        total += sum(_mixed_op_params(c, s) for s in edge_strides(reduction))
        c_last = NODES * c
    return total + c_last * cfg.classes + cfg.classes
