"""bitsandbytes' formats fuzzed against bitsandbytes 0.50 itself on the CPU: random shapes (odd
sizes, a single row, rows and columns that are not multiples of the block), zero rows and
blocks, large, tiny and subnormal values, float32/float16/bfloat16 inputs, every block size
`quantize_4bit` accepts and double quantisation on and off; NF4, FP4 and int8.

Where treemod differs from bitsandbytes, the test says by how much and why:
- the double-quantisation offset is torch's float32 mean, whose summation order depends on the
  CPU's vector width and thread count; given bitsandbytes' offset, everything else is equal;
- XLA flushes subnormal float32 results to zero, so a dequantised value below 2**-126 in
  magnitude is 0 (bitsandbytes keeps the subnormal);
- bitsandbytes' CPU `dequantize_4bit` kernel (rows a multiple of 16 values, blocks under 2048)
  reads row `r`'s absmax at `r * (n // block) + col // block`, which is a different block when
  a block straddles rows; treemod reads the block the quantiser wrote, as bitsandbytes' own
  torch backend (its fallback for other shapes) does, and equals the kernel where it is right.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import treemod.quant as quant
from treemod.quant import _formats as fmt
from treemod.quant._layers import nf4_unit, row_slices

torch = pytest.importorskip("torch")
F = pytest.importorskip("bitsandbytes.functional")
default_ops = pytest.importorskip("bitsandbytes.backends.default.ops")

BLOCKS = [32, 64, 128, 256, 512, 1024, 2048, 4096]
TINY = float(np.finfo(np.float32).tiny)  # 2**-126, the smallest normal float32
# Subnormal float32 values (bfloat16 has the same exponent range; float16's are normal there).
SUBNORMALS = [1e-40, -1e-40, 1.4e-45, -3e-39, 1.1e-38]
# bitsandbytes' torch backend, uncompiled: the definition its CPU dispatcher falls back to.
reference_dequantise_4bit = default_ops._dequantize_4bit_compute.__wrapped__


def _bits(x: Any) -> np.ndarray:
    """The float32 bits, every NaN as one (NaN payloads carry nothing)."""
    a = np.ascontiguousarray(np.asarray(x, np.float32))
    return np.where(np.isnan(a), np.uint32(0x7FC00000), a.view(np.uint32))


@st.composite
def weights(draw: Any, max_rows: int = 12, max_cols: int = 70) -> Any:
    """A torch weight of a random shape and dtype with zero rows and blocks, large values and
    (float32 and bfloat16) subnormals mixed in."""
    rows, cols = draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols))
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    half = dtype == torch.float16
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0] + ([1e-4] if half else [1e-30, 1e30])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    flat = w.reshape(-1)
    for row in draw(st.sets(st.integers(0, rows - 1), max_size=2)):
        w[row] = 0
    if draw(st.booleans()):  # a zero run, a whole block when it is long enough
        start = draw(st.integers(0, flat.size - 1))
        flat[start : start + draw(st.sampled_from([32, 64, 200]))] = 0
    if draw(st.booleans()):
        big = 6e4 if half else 3e38
        flat[rng.integers(0, flat.size, 3)] = rng.choice([-big, big], 3)
    if not half and draw(st.booleans()):
        flat[rng.integers(0, flat.size, 5)] = rng.choice(SUBNORMALS, 5)
    t = torch.from_numpy(w).to(dtype)
    assume(bool(torch.isfinite(t).all()))
    return t


def _jax(t: Any) -> Any:
    return jnp.asarray(t.float().numpy()).astype(str(t.dtype).removeprefix("torch."))


def _kernel_indexes_right(rows: int, n: int, block: int) -> bool:
    """Whether bitsandbytes' CPU `dequantize_4bit` reads each value's own block's absmax."""
    if n % 16 or block >= 2048:
        return True  # its scalar kernel or its torch fallback
    r, c = np.arange(rows)[:, None], np.arange(n)[None]
    return bool(np.all(r * (n // block) + c // block == (r * n + c) // block))


def _layer(t: Any, arrays: dict[str, Any], block: int, quant_type: str) -> Any:
    """An `NF4Linear` of `t`'s shape and dtype holding `arrays` (`quantise_4bit`'s names)."""
    rows, n = t.shape
    return quant.NF4Linear(
        weight=jnp.asarray(arrays["packed"]),
        absmax=jnp.asarray(arrays["absmax"]),
        nested_absmax=arrays.get("nested_absmax"),
        offset=arrays.get("offset"),
        block_size=block,
        quant_type=quant_type,
        bias=None,
        in_features=n,
        out_features=rows,
        dtype=str(t.dtype).removeprefix("torch."),
        slices=row_slices(rows, nf4_unit(n, block)),
    )


# Every 4-bit case: a weight, a block size bitsandbytes accepts, NF4 or FP4, double quantisation.
FOUR_BIT = {
    "t": weights(),
    "block": st.sampled_from(BLOCKS),
    "quant_type": st.sampled_from(["nf4", "fp4"]),
    "double_quant": st.booleans(),
}


@settings(max_examples=25)
@given(**FOUR_BIT)
def test_4bit_quantisation_is_bitsandbytes(
    t: Any, block: int, quant_type: str, double_quant: bool
) -> None:
    packed, state = F.quantize_4bit(
        t, blocksize=block, compress_statistics=double_quant, quant_type=quant_type
    )
    ours = fmt.quantise_4bit(_jax(t), block, double_quant, quant_type)
    # Subnormal and huge values included: treemod rounds as torch does without XLA's flushing.
    assert np.array_equal(np.asarray(ours["packed"]), packed.numpy().ravel())
    if not double_quant:
        assert np.array_equal(_bits(ours["absmax"]), _bits(state.absmax))
        return
    # The offset is torch's float32 mean (its summation order is the CPU's). Given it, the
    # nested 8-bit levels are within one step of the dynamic map of bitsandbytes': its CPU
    # lookup (BinSearch on a float grid) is not exactly round-to-nearest (about 0.1% of values
    # go to the neighbouring level, and those within 1.5e-5 of zero to +-2.1e-5).
    _, plain = F.quantize_4bit(t, blocksize=block, quant_type=quant_type)
    offset = state.offset.numpy()
    if not np.isfinite(offset):  # the absmax values' sum overflows: refused by the layer
        with pytest.raises(ValueError, match="NF4Linear: the double quantisation's offset"):
            _layer(t, ours, block, quant_type)
        return
    np.testing.assert_allclose(np.asarray(ours["offset"]), offset, rtol=4e-7)
    q, nested = fmt.quantise_blockwise(
        jnp.asarray(plain.absmax.numpy() - offset), fmt.DYNAMIC_CODE, fmt.NESTED_BLOCK
    )
    gap = np.abs(fmt.DYNAMIC_CODE[np.asarray(q)] - fmt.DYNAMIC_CODE[state.absmax.numpy()])
    assert gap.max() <= np.diff(fmt.DYNAMIC_CODE).max()
    assert np.array_equal(_bits(nested), _bits(state.state2.absmax))


@settings(max_examples=25)
@given(**FOUR_BIT)
def test_4bit_dequantisation_is_bitsandbytes(
    t: Any, block: int, quant_type: str, double_quant: bool
) -> None:
    packed, state = F.quantize_4bit(
        t, blocksize=block, compress_statistics=double_quant, quant_type=quant_type
    )
    if double_quant:
        absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        ours_absmax = fmt.absmax_4bit(
            jnp.asarray(state.absmax.numpy()),
            jnp.asarray(state.state2.absmax.numpy()),
            jnp.asarray(state.offset.numpy()),
        )
        # XLA flushes a subnormal absmax (an all-zero last block's 1e-38 plus the mean) to 0.
        kept = ~((absmax != 0) & (absmax.abs() < TINY)).numpy()
        assert np.array_equal(_bits(ours_absmax)[kept], _bits(absmax)[kept])
    else:
        absmax = state.absmax
    code = F.get_4bit_type(quant_type, device="cpu")
    want = reference_dequantise_4bit(
        packed.reshape(-1), absmax, code, block, state.shape, t.dtype
    ).float()
    dtype = str(t.dtype).removeprefix("torch.")
    got = fmt.dequantise_4bit(
        jnp.asarray(packed.numpy().ravel()), jnp.asarray(absmax.numpy()), block, dtype, quant_type
    )
    got = np.asarray(got.astype(jnp.float32))[: t.numel()]
    want = want.numpy().ravel()
    # XLA flushes subnormal results to zero; bitsandbytes keeps them.
    flushed = (want != 0) & (np.abs(want) < TINY)
    assert np.array_equal(_bits(got[~flushed]), _bits(want[~flushed]))
    assert not got[flushed].any()
    rows, n = t.shape
    if _kernel_indexes_right(rows, n, block):
        # bitsandbytes' public function; its scalar CPU kernel gives FP4's level 8 as -0.0.
        public = F.dequantize_4bit(packed, state).float().numpy().ravel()
        assert np.array_equal(got[~flushed], public[~flushed], equal_nan=True)
    if t.numel() % 2 == 0:
        # The layer holding bitsandbytes' arrays, dequantised slice by slice.
        arrays = {"packed": packed.numpy().ravel(), "absmax": absmax.numpy()}
        layer = _layer(t, arrays, block, quant_type)
        whole = np.asarray(layer.dequantised_weight().astype(jnp.float32)).ravel()
        assert np.array_equal(_bits(whole), _bits(got))


@settings(max_examples=20)
@given(t=weights())
def test_int8_is_bitsandbytes(t: Any) -> None:
    q, scb, _ = F.int8_vectorwise_quant(t.clone())
    ours_q, ours_absmax = fmt.quantise_int8(_jax(t))
    assert np.array_equal(_bits(ours_absmax), _bits(scb))
    # bitsandbytes' scale `127 * (1 / absmax)` is inf for a row whose absmax is zero or tiny,
    # and its levels there undefined; treemod's are 0.
    with np.errstate(over="ignore", divide="ignore"):
        defined = np.isfinite(np.float32(127) * (np.float32(1) / scb.numpy()))
    assert np.array_equal(np.asarray(ours_q)[defined], q.numpy()[defined])
    assert not np.asarray(ours_q)[~defined].any()
    want = F.int8_vectorwise_dequant(q, scb).numpy()
    got = fmt.dequantise_int8(jnp.asarray(q.numpy()), jnp.asarray(scb.numpy()), "float32")
    got = np.asarray(got)
    # XLA flushes subnormal results to zero; bitsandbytes keeps them.
    flushed = (want != 0) & (np.abs(want) < TINY)
    kept = defined[:, None] & ~flushed
    assert np.array_equal(_bits(got[kept]), _bits(want[kept]))
    assert not got[defined[:, None] & flushed].any()


def test_unrepresentable_inputs_are_refused_by_name() -> None:
    with pytest.raises(
        ValueError, match=r"NF4Linear: quant_type must be one of \['fp4', 'nf4'\].*'af4'"
    ):
        quant.NF4Linear(
            weight=jnp.zeros(8, jnp.uint8), absmax=jnp.zeros(1), nested_absmax=None, offset=None,
            block_size=64, quant_type="af4", bias=None, in_features=4, out_features=4,
            dtype="float32", slices=1,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"quant_type must be one of \['fp4', 'nf4'\].*'int4'"):
        fmt.quantise_4bit(jnp.ones((2, 2)), 64, False, "int4")
