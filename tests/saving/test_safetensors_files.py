"""The one reader and writer of plain safetensors files, against `safetensors.torch` and NumPy.

Every dtype code safetensors defines that treemod reads is written by PyTorch's writer and read
back by `TensorFiles` (what `from_pretrained`, `load_state_dict` of a path and `load_adapter`
use), bit for bit; treemod's writer (`write_tensors`, what `save_pretrained` and `save_adapter`
use) is read back by PyTorch's reader. Slices read in row blocks equal NumPy's slicing.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import treemod as tm
import treemod._saving.safetensors_files as files_module
from treemod._saving.safetensors_dtypes import STANDARD
from treemod._saving.safetensors_files import TensorFiles
from treemod._saving.safetensors_write import write_tensors

# safetensors' codes with the torch dtype that writes them.
TORCH = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "U16": torch.uint16,
    "I16": torch.int16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(-1).view(torch.uint8).numpy()


def _random(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_numpy(np.random.default_rng(0).integers(0, 256, size, np.uint8))
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def _save(path: Path, tensor: torch.Tensor, code: str) -> None:
    """safetensors.torch's file of `tensor` under the name "t"; for a dtype the installed
    safetensors predates (the FNUZ float8s before 0.8), the same file written by the format's
    definition (8-byte header length, JSON header, raw little-endian bytes)."""
    try:
        save_file({"t": tensor}, str(path))
    except KeyError:
        data = _bits(tensor).tobytes()
        entry = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [0, len(data)]}
        header = json.dumps({"t": entry}).encode()
        header += b" " * (-len(header) % 8)
        path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _knows(dtype: torch.dtype, tmp_path: Path) -> bool:
    """Whether the installed safetensors writes (and so reads) `dtype`."""
    try:
        save_file({"t": torch.zeros(1, dtype=dtype)}, str(tmp_path / "probe.safetensors"))
    except KeyError:
        return False
    return True


def _load(path: Path) -> tuple[str, list[int], np.ndarray]:
    """`(dtype code, shape, bytes)` of tensor "t", read by the format's definition."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    entry = json.loads(raw[8 : 8 + n])["t"]
    begin, end = entry["data_offsets"]
    return entry["dtype"], entry["shape"], np.frombuffer(raw[8 + n + begin : 8 + n + end], np.uint8)


def test_the_table_holds_every_code_treemod_reads() -> None:
    assert set(STANDARD.values()) == set(TORCH)


@pytest.mark.parametrize("code", sorted(TORCH))
def test_every_dtype_reads_and_writes_bit_for_bit(code: str, tmp_path: Path) -> None:
    tensor = _random(TORCH[code], (3, 4))
    _save(tmp_path / "torch.safetensors", tensor, code)
    files = TensorFiles([tmp_path / "torch.safetensors"])
    read = files.read("t")
    assert read.dtype.itemsize == tensor.element_size() and read.shape == (3, 4)
    np.testing.assert_array_equal(read.reshape(-1).view(np.uint8), _bits(tensor))
    write_tensors(tmp_path / "treemod.safetensors", [("t", read)], {"format": "pt"}, "test")
    assert _load(tmp_path / "treemod.safetensors")[:2] == (code, [3, 4])
    np.testing.assert_array_equal(_load(tmp_path / "treemod.safetensors")[2], _bits(tensor))
    if not _knows(TORCH[code], tmp_path):
        return  # a dtype the installed safetensors predates: the format check above holds
    back = load_file(str(tmp_path / "treemod.safetensors"))["t"]
    assert back.dtype == TORCH[code]
    np.testing.assert_array_equal(_bits(back), _bits(tensor))


@pytest.mark.parametrize("code", ["C64", "F8_E4M3FNUZ", "BF16"])
def test_load_state_dict_of_a_file_reads_the_same_dtypes(code: str, tmp_path: Path) -> None:
    tensor = _random(TORCH[code], (2, 3))
    path = tmp_path / "w.safetensors"
    _save(path, tensor, code)
    dtype = TensorFiles([path]).tensors["t"].dtype
    like = {"t": jax.ShapeDtypeStruct((2, 3), jnp.dtype(dtype))}
    loaded = tm.load_state_dict(like, str(path))
    np.testing.assert_array_equal(np.asarray(loaded["t"]).reshape(-1).view(np.uint8), _bits(tensor))


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple),
    data=st.data(),
    chunk=st.sampled_from([1, 7, 64, 1 << 20]),
)
def test_slices_read_in_row_blocks_equal_numpy(
    shape: tuple[int, ...], data: Any, chunk: int, tmp_path_factory: Any
) -> None:
    path = tmp_path_factory.mktemp("slices") / "w.safetensors"
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 0.5
    save_file({"w": torch.from_numpy(np.array(array))}, str(path))
    index = tuple(
        slice(a, b)
        for a, b in (
            sorted(data.draw(st.tuples(st.integers(0, n), st.integers(0, n)))) for n in shape
        )
    )
    original = files_module.CHUNK_BYTES
    files_module.CHUNK_BYTES = chunk
    try:
        files = TensorFiles([path])
        np.testing.assert_array_equal(files.read("w", index), array[index])
        out = np.empty(array[index].shape, np.float64)  # cast on the way in
        files.read_into("w", index or (), out)
        np.testing.assert_array_equal(out, array[index])
    finally:
        files_module.CHUNK_BYTES = original


def test_a_tensor_in_two_files_names_both(tmp_path: Path) -> None:
    for name in ("a", "b"):
        save_file({"w": torch.zeros(2)}, str(tmp_path / f"{name}.safetensors"))
    with pytest.raises(tm.CheckpointError, match=r"load: tensor 'w' is in both .*a\.safetensors"):
        TensorFiles([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], "load")


def test_a_file_cut_short_after_opening_names_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(1000)}, str(path))
    files = TensorFiles([path], "from_pretrained")
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 100)
    with pytest.raises(
        tm.CheckpointError, match=r"from_pretrained: .*w\.safetensors: reading tensor 'w' stopped"
    ):
        files.read("w")


def test_an_array_that_cannot_be_fetched_is_named(tmp_path: Path) -> None:
    donated = jnp.ones(3)
    donated.delete()
    with pytest.raises(
        RuntimeError, match=r"save_pretrained: could not fetch the array at h\.0\.w"
    ):
        write_tensors(tmp_path / "w.safetensors", [("h.0.w", donated)], {}, "save_pretrained")


def test_a_dtype_safetensors_cannot_hold_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"save_adapter: tensor 'q' is int4"):
        write_tensors(
            tmp_path / "w.safetensors", [("q", jnp.ones(2, jnp.int4))], {}, "save_adapter"
        )
