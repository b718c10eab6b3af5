"""Writing safetensors files shard by shard (`_saving/sharded_write.py`) in one process.

References: NumPy's own indexing for where a box's bytes lie (`shard_runs`), the file
`write_tensors` writes from whole arrays (byte for byte), the `safetensors` package reading the
files, and tracemalloc's count of the host memory a sharded `save_pretrained` allocates.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import treemod as tm
from treemod._saving.safetensors_write import write_tensors
from treemod._saving.sharded_write import shard_runs, write_tensors_sharded
from treemod.models import LlamaForCausalLM, save_pretrained


@st.composite
def boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[slice, ...], int]:
    shape = tuple(draw(st.lists(st.integers(1, 5), max_size=4)))
    index = []
    for n in shape:
        start = draw(st.integers(0, n - 1))
        index.append(slice(start, draw(st.integers(start + 1, n))))
    return shape, tuple(index), draw(st.sampled_from([1, 2, 4, 8]))


@given(boxes())
def test_shard_runs_are_where_numpy_puts_the_box(
    case: tuple[tuple[int, ...], tuple[slice, ...], int],
) -> None:
    shape, index, itemsize = case
    # Each element numbered by its byte offset in the row-major array.
    offsets = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * itemsize
    want = offsets[index].reshape(-1)
    starts, run = shard_runs(shape, index, itemsize)
    got = (starts[:, None] + np.arange(0, run, itemsize)[None, :]).reshape(-1)
    np.testing.assert_array_equal(got, want)


def test_a_box_with_a_step_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"shard_runs: the box .*slice\(0, 4, 2\).* has a step"):
        shard_runs((4,), (slice(0, 4, 2),), 4)


def _mesh(shape: tuple[int, ...]) -> Mesh:
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), ("a", "b")[: len(shape)])


SPECS = [P(), P("a"), P(None, "a"), P("a", "b"), P("b", "a"), P(None, ("a", "b"))]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_sharded_file_is_byte_identical_to_the_whole_arrays_file(tmp_path: Path, spec: P) -> None:
    mesh = _mesh((2, 4))
    rng = np.random.default_rng(0)
    whole = {
        "w": rng.standard_normal((8, 16)).astype(np.float32),
        "h": rng.standard_normal((8, 8)).astype(np.float16),
        "b": rng.integers(0, 9, (4, 8)).astype(np.int32),
        "s": np.float32(3.0),
        "bf": jnp.asarray(rng.standard_normal((8, 8)), jnp.bfloat16),
        "t3": rng.standard_normal((4, 8, 8)).astype(np.float32),
    }
    specs = {2: spec, 3: P(None, *spec), 0: P()}  # a stacked array: its last two axes split
    placed = [
        (n, jax.device_put(v, NamedSharding(mesh, specs[np.ndim(v)]))) for n, v in whole.items()
    ]
    written = write_tensors_sharded(tmp_path / "s.safetensors", placed, {"format": "pt"}, "t")
    write_tensors(tmp_path / "w.safetensors", list(whole.items()), {"format": "pt"}, "t")
    assert (tmp_path / "s.safetensors").read_bytes() == (tmp_path / "w.safetensors").read_bytes()
    # Each value written once, whatever the replication.
    assert written == sum(np.asarray(v).nbytes for v in whole.values())


def test_a_shard_that_cannot_be_fetched_is_named(tmp_path: Path) -> None:
    mesh = _mesh((8,))
    a = jax.device_put(np.ones((8, 2), np.float32), NamedSharding(mesh, P("a")))
    a.delete()
    message = r"save_pretrained: could not fetch the array at w\.x \(it was deleted: donated"
    with pytest.raises(RuntimeError, match=message + r".*save the arrays before donating"):
        write_tensors_sharded(tmp_path / "f.safetensors", [("w.x", a)], {}, "save_pretrained")


LLAMA = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def test_save_pretrained_of_an_fsdp_model_holds_a_shard_at_a_time(tmp_path: Path) -> None:
    """The sharded model's files equal the one-device model's, byte for byte; tracemalloc's
    peak during the save (host copies: NumPy's allocations are traced) stays a fraction of the
    model's bytes, where gathering it would take them all."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharded = tm.shard(model, mesh, tm.fsdp_rules())
    arrays = jax.tree.leaves(tm.filter(sharded, tm.is_array))
    assert all(len(a.sharding.device_set) == 8 for a in arrays)
    total = sum(a.nbytes for a in arrays)
    save_pretrained(model, tmp_path / "whole")
    save_pretrained(sharded, tmp_path / "warm")  # compiles the layer slicing: not the save's data
    tracemalloc.start()
    try:
        save_pretrained(sharded, tmp_path / "sharded")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    whole = (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert (tmp_path / "sharded" / "model.safetensors").read_bytes() == whole
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    # Measured 206 kB of the model's 1.84 MB (0.11x); gathering it would take 1x, and the largest
    # tensor alone (the 512 x 128 embedding) is 262 kB.
    assert peak < 0.2 * total, (peak, total)
    loaded = safetensors_numpy.load_file(str(tmp_path / "sharded" / "model.safetensors"))
    np.testing.assert_array_equal(loaded["lm_head.weight"], np.asarray(model.lm_head.weight))
