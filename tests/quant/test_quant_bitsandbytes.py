"""The formats against their definitions' reference implementations: NF4, FP4 and int8 against
bitsandbytes' own quantiser on the CPU (bit for bit), int4 against GPTQ's `Quantizer` written
in NumPy. (`test_bitsandbytes_fuzz.py` fuzzes the bitsandbytes formats.)"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.nn as nn
import treemod.quant as quant
from treemod.quant import _formats as fmt
from treemod.quant._layers import nf4_unit, row_slices

torch = pytest.importorskip("torch")
F = pytest.importorskip("bitsandbytes.functional")

SHAPES = [((96, 64), 64), ((48, 40), 64), ((300, 128), 32), ((40, 256), 4096)]


def _weights(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.05 * rng.standard_normal(shape)).astype(np.float32)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, np.float32).view(np.uint32)


def _linear(w: np.ndarray, dtype: Any) -> nn.Sequential:
    layer = nn.Linear(w.shape[1], w.shape[0], use_bias=False, dtype=dtype, key=jax.random.key(0))
    return nn.Sequential([tm.tree_at(lambda m: m.weight, layer, jnp.asarray(w, dtype))])


def test_the_code_tables_are_bitsandbytes() -> None:
    assert np.array_equal(_bits(fmt.DYNAMIC_CODE), _bits(F.create_dynamic_map(signed=True).numpy()))
    nf4 = F.get_4bit_type("nf4", device="cpu").numpy()
    assert np.array_equal(_bits(fmt.NF4_CODE), _bits(nf4))
    fp4 = F.get_4bit_type("fp4", device="cpu").numpy()
    assert np.array_equal(_bits(fmt.FP4_CODE), _bits(fp4))


@pytest.mark.parametrize(("shape", "block"), SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nf4_without_double_quantisation_is_bitsandbytes_bit_for_bit(
    shape: tuple[int, int], block: int, dtype: str
) -> None:
    w = _weights(shape)
    tw = torch.from_numpy(w).to(getattr(torch, dtype))
    packed, state = F.quantize_4bit(
        tw, blocksize=block, compress_statistics=False, quant_type="nf4"
    )
    want = F.dequantize_4bit(packed, state).float().numpy()
    layer = quant.quantise(_linear(w, jnp.dtype(dtype)), ["0"], "nf4", block_size=block,
                           double_quant=False).layers[0]  # fmt: skip
    assert np.array_equal(np.asarray(layer.weight), packed.numpy().ravel())
    assert np.array_equal(_bits(np.asarray(layer.absmax)), _bits(state.absmax.numpy()))
    got = np.asarray(layer.dequantised_weight().astype(jnp.float32))
    assert np.array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize(
    ("shape", "block", "dtype"),
    [(*s, d) for s, d in zip(SHAPES, ["float32", "bfloat16"] * 2, strict=True)],
)
def test_nf4_with_double_quantisation_matches_bitsandbytes(
    shape: tuple[int, int], block: int, dtype: str
) -> None:
    w = _weights(shape, seed=1)
    tw = torch.from_numpy(w).to(getattr(torch, dtype))
    packed, state = F.quantize_4bit(tw, blocksize=block, compress_statistics=True, quant_type="nf4")
    want = F.dequantize_4bit(packed, state).float().numpy()
    layer = quant.quantise(_linear(w, jnp.dtype(dtype)), ["0"], "nf4", block_size=block).layers[0]
    # The 4-bit levels are bitsandbytes'; the absmax mean (the offset) is a float32 sum whose
    # order bitsandbytes leaves to torch, so it may differ in the last bit and move an absmax.
    assert np.array_equal(np.asarray(layer.weight), packed.numpy().ravel())
    np.testing.assert_allclose(np.asarray(layer.offset), state.offset.numpy(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.nested_absmax), state.state2.absmax.numpy(),
                               rtol=1e-5)  # fmt: skip
    got = np.asarray(layer.dequantised_weight().astype(jnp.float32))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=0)
    # bitsandbytes' own state in an NF4Linear dequantises to bitsandbytes' values, bit for bit.
    theirs = tm.tree_at(
        lambda m: (m.absmax, m.nested_absmax, m.offset),
        layer,
        (jnp.asarray(state.absmax.numpy()), jnp.asarray(state.state2.absmax.numpy()),
         jnp.asarray(state.offset.numpy())),
    )  # fmt: skip
    assert np.array_equal(_bits(np.asarray(theirs.dequantised_weight().astype(jnp.float32))),
                          _bits(want))  # fmt: skip


@pytest.mark.parametrize(("shape", "block"), SHAPES)
@pytest.mark.parametrize("double_quant", [False, True])
def test_fp4_is_bitsandbytes_bit_for_bit(
    shape: tuple[int, int], block: int, double_quant: bool
) -> None:
    w = _weights(shape, seed=5)
    packed, state = F.quantize_4bit(
        torch.from_numpy(w), blocksize=block, compress_statistics=double_quant, quant_type="fp4"
    )
    ours = fmt.quantise_4bit(jnp.asarray(w), block, double_quant, "fp4")
    assert np.array_equal(np.asarray(ours["packed"]), packed.numpy().ravel())
    if not double_quant:
        assert np.array_equal(_bits(np.asarray(ours["absmax"])), _bits(state.absmax.numpy()))
    # bitsandbytes' arrays in an FP4 NF4Linear dequantise to bitsandbytes' values. (Its scalar
    # CPU kernel, for rows not a multiple of 16, gives level 8 as -0.0: `+ 0.0` makes it 0.0.)
    layer = quant.NF4Linear(
        weight=jnp.asarray(packed.numpy().ravel()),
        absmax=jnp.asarray(state.absmax.numpy()),
        nested_absmax=jnp.asarray(state.state2.absmax.numpy()) if double_quant else None,
        offset=jnp.asarray(state.offset.numpy()) if double_quant else None,
        block_size=block, quant_type="fp4", bias=None, in_features=shape[1],
        out_features=shape[0], dtype="float32",
        slices=row_slices(shape[0], nf4_unit(shape[1], block)),
    )  # fmt: skip
    want = F.dequantize_4bit(packed, state).numpy() + np.float32(0)
    assert np.array_equal(_bits(np.asarray(layer.dequantised_weight())), _bits(want))


def test_int8_is_bitsandbytes_row_wise_int8() -> None:
    w = _weights((40, 24), seed=2)
    q, scb, _ = F.int8_vectorwise_quant(torch.from_numpy(w.copy()))
    want = F.int8_vectorwise_dequant(q, scb).numpy()
    layer = quant.quantise(_linear(w, jnp.float32), ["0"], "int8").layers[0]
    assert np.array_equal(np.asarray(layer.weight), q.numpy())
    assert np.array_equal(_bits(np.asarray(layer.absmax)), _bits(scb.numpy()))
    assert np.array_equal(_bits(np.asarray(layer.dequantised_weight())), _bits(want))
    w[3] = 0  # a zero row (bitsandbytes divides by its zero absmax) dequantises to zeros
    zero_row = quant.quantise(_linear(w, jnp.float32), ["0"], "int8").layers[0]
    assert not np.asarray(zero_row.dequantised_weight())[3].any()


def _gptq_reference(w: np.ndarray, group: int) -> np.ndarray:
    """GPTQ's `Quantizer` (bits=4, sym=False, per group, no Hessian), in NumPy float32."""
    out = np.empty_like(w)
    for g in range(w.shape[1] // group):
        x = w[:, g * group : (g + 1) * group]
        xmin = np.minimum(x.min(1), 0)
        xmax = np.maximum(x.max(1), 0)
        both = (xmin == 0) & (xmax == 0)
        xmin[both], xmax[both] = -1, 1
        scale = ((xmax - xmin) / np.float32(15)).astype(np.float32)
        zero = np.round(-xmin / scale)
        q = np.clip(np.round(x / scale[:, None]) + zero[:, None], 0, 15)
        out[:, g * group : (g + 1) * group] = scale[:, None] * (q - zero[:, None])
    return out


@pytest.mark.parametrize(("shape", "group"), [((24, 64), 32), ((16, 256), 128), ((8, 32), 32)])
def test_int4_is_gptqs_asymmetric_group_quantiser(shape: tuple[int, int], group: int) -> None:
    w = _weights(shape, seed=3)
    w[0, :group] = 0  # an all-zero group: GPTQ's range becomes [-1, 1]
    w[1, :group] = np.abs(w[1, :group])  # a positive group: the range still includes 0
    layer = quant.quantise(_linear(w, jnp.float32), ["0"], "int4", group_size=group).layers[0]
    got = np.asarray(layer.dequantised_weight())
    np.testing.assert_allclose(got, _gptq_reference(w, group), rtol=1e-6, atol=1e-9)
