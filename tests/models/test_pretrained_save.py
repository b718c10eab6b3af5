"""`save_pretrained` on the tests' tiny zoo model: the files (read back with `safetensors`),
shards and index, replacing old weights, a crash mid-save, and the save-then-load law.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pretrained_zoo import (
    DIM,
    assert_close,
    make_tensors,
    write,
)
from safetensors.numpy import load_file

import treemod as tm
import treemod.nn as nn
from treemod.models import (
    from_pretrained,
    save_pretrained,
)

# Saving. ----------------------------------------------------------------------------------------


def test_save_writes_what_transformers_expects_and_loads_back(tmp_path: Path) -> None:
    tensors = make_tensors(8)
    model = from_pretrained(write(tmp_path / "in", tensors))
    save_pretrained(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["TreemodTestTinyTied"] and config["dtype"] == "float32"
    assert config["model_type"] == "treemod-test-tiny" and config["hidden_size"] == DIM
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(written) == sorted(tensors)  # the tied alias is not written
    for name, value in tensors.items():
        np.testing.assert_array_equal(written[name], value)
    assert_close(from_pretrained(tmp_path / "out"), tensors)


def test_save_shards_above_the_size_with_an_index(tmp_path: Path) -> None:
    tensors = make_tensors(9)
    model = from_pretrained(write(tmp_path / "in", tensors))
    save_pretrained(model, tmp_path / "out", max_shard_size=400)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (tmp_path / "out" / "model.safetensors").exists()
    total = 0
    for shard in shards:
        part = load_file(str(tmp_path / "out" / shard))
        size = sum(v.nbytes for v in part.values())
        assert size <= 400 or len(part) == 1
        total += size
        for name, value in part.items():
            assert index["weight_map"][name] == shard
            np.testing.assert_array_equal(value, tensors[name])
    assert index["metadata"]["total_size"] == total == sum(v.nbytes for v in tensors.values())
    assert_close(from_pretrained(tmp_path / "out"), tensors)
    # Saving again unsharded replaces the shards and keeps other files.
    (tmp_path / "out" / "tokenizer.json").write_text("{}")
    save_pretrained(model, tmp_path / "out", max_shard_size="1MB")
    assert sorted(os.listdir(tmp_path / "out")) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


@pytest.mark.parametrize("size", ["5 parsecs", 0, -3, "GB", True])
def test_bad_shard_size(tmp_path: Path, size: Any) -> None:
    model = from_pretrained(write(tmp_path / "in", make_tensors()))
    with pytest.raises(ValueError, match=f"max_shard_size={size!r} is not a size"):
        save_pretrained(model, tmp_path / "out", max_shard_size=size)


def test_shard_size_units() -> None:
    from treemod.models._pretrained_save import parse_size

    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30
    assert parse_size("500kb") == 500_000 and parse_size(1234) == 1234


def test_a_crash_while_saving_leaves_the_old_checkpoint_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = make_tensors(10), make_tensors(11)
    write(tmp_path, old)
    model = from_pretrained(write(tmp_path / "new", new))
    import treemod.models._pretrained_save as saving

    calls, real = [], saving.write_tensors

    def failing(filename: Any, *args: Any) -> None:
        calls.append(filename)
        real(filename, *args)
        if len(calls) == 2:  # the second shard written in part, then the disk is full
            with open(filename, "r+b") as f:
                f.truncate(os.path.getsize(filename) // 2)
            raise OSError("disk full")

    monkeypatch.setattr(saving, "write_tensors", failing)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(model, tmp_path, max_shard_size=300)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
    assert_close(from_pretrained(tmp_path), old)


def test_save_refuses_a_model_that_is_not_a_zoo_model(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Linear is not a treemod.models.PretrainedModel"):
        save_pretrained(nn.Linear(2, 2, key=jax.random.key(0)), tmp_path)  # type: ignore[arg-type]


# Round trips over shard sizes and dtypes. --------------------------------------------------------


@settings(max_examples=15)
@given(
    size=st.integers(min_value=1, max_value=2000),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
    seed=st.integers(0, 3),
)
def test_save_then_load_is_the_identity(size: int, dtype: str, seed: int) -> None:
    """Law: save_pretrained -> from_pretrained gives the same arrays, whatever the shard size and
    dtype, and every shard is within the size unless it holds one tensor (NumPy reads them)."""
    with tempfile.TemporaryDirectory() as scratch:
        source = write(Path(scratch) / "in", make_tensors(seed, np.dtype(jnp.dtype(dtype))))
        model = from_pretrained(source)
        out = Path(scratch) / "out"
        save_pretrained(model, out, max_shard_size=size)
        for file in out.glob("*.safetensors"):
            part = load_file(str(file))
            assert sum(v.nbytes for v in part.values()) <= size or len(part) == 1
        again = from_pretrained(out)
        assert again.embed.weight.dtype == jnp.dtype(dtype)
        for name, value in tm.state_dict(model).items():
            np.testing.assert_array_equal(tm.state_dict(again)[name], value)


def test_unmerged_lora_adapters_are_refused_and_merged_ones_save(tmp_path: Path) -> None:
    import treemod.lora as lora
    from treemod.models import LlamaForCausalLM

    config = {
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    model = LlamaForCausalLM.from_config(config, key=jax.random.key(0))
    save_pretrained(model, tmp_path)
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=2, alpha=4, key=jax.random.key(1))
    with pytest.raises(ValueError, match=r"q_proj\.base_layer\.weight.*treemod\.lora\.merge"):
        save_pretrained(tuned, tmp_path)
    from_pretrained(tmp_path)  # the old checkpoint is untouched
    save_pretrained(lora.merge(tuned), tmp_path)
    assert set(tm.state_dict(from_pretrained(tmp_path))) == set(tm.state_dict(model))


def test_a_donated_array_is_named(tmp_path: Path) -> None:
    model = from_pretrained(write(tmp_path / "src", make_tensors()))
    model.embed.weight.delete()
    with pytest.raises(RuntimeError, match=r"save_pretrained: could not fetch the array at embed"):
        save_pretrained(model, tmp_path / "out")
