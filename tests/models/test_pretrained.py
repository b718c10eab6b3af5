"""`from_pretrained` on a tiny zoo model of the tests' own (`pretrained_zoo.py`): loading,
ties, dtypes, the strict error and partial loads, and every damaged-directory error.

References: tensors written with the `safetensors` library's NumPy API, outputs computed with
NumPy from them. Every error path checks that its message names the file and tensor involved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from pretrained_zoo import (
    CONFIG,
    DIM,
    TinyTiedModel,
    assert_close,
    make_tensors,
    write,
    write_sharded,
)
from safetensors.numpy import save_file

import treemod as tm
from treemod.models import (
    PretrainedConfig,
    from_pretrained,
)

# Loading. ---------------------------------------------------------------------------------------


def test_single_file_loads_every_tensor_and_computes_numpy_output(tmp_path: Path) -> None:
    tensors = make_tensors()
    model = from_pretrained(write(tmp_path, tensors))
    assert isinstance(model, TinyTiedModel)
    np.testing.assert_array_equal(model.blocks.layers.weight[2], tensors["blocks.2.weight"])
    np.testing.assert_array_equal(model.embed.weight, tensors["embed.weight"])
    assert model.config == PretrainedConfig(CONFIG)
    assert_close(model, tensors)


def test_sharded_directory_loads_like_one_file(tmp_path: Path) -> None:
    tensors = make_tensors(1)
    model = from_pretrained(write_sharded(tmp_path, tensors))
    for name, value in tm.state_dict(model).items():
        np.testing.assert_array_equal(value, tensors[name])


def test_tied_alias_written_equal_or_alone_loads_as_one_array(tmp_path: Path) -> None:
    tensors = make_tensors(2)
    with_alias = {**tensors, "head.weight": tensors["embed.weight"].copy()}
    model = from_pretrained(write(tmp_path / "both", with_alias))
    assert_close(model, tensors)
    alone = {("head.weight" if k == "embed.weight" else k): v for k, v in tensors.items()}
    model = from_pretrained(write(tmp_path / "alias-only", alone))
    np.testing.assert_array_equal(model.embed.weight, tensors["embed.weight"])


def test_tied_alias_with_other_values_is_refused(tmp_path: Path) -> None:
    tensors = make_tensors(3)
    bad = {**tensors, "head.weight": tensors["embed.weight"] + 1}
    with pytest.raises(
        tm.CheckpointError, match=r"head\.weight.*model\.safetensors.*embed\.weight"
    ):
        from_pretrained(write(tmp_path, bad))
    _, report = from_pretrained(tmp_path, strict=False)
    assert report.unexpected == ("head.weight",)


@pytest.mark.parametrize("file_dtype", [ml_dtypes.bfloat16, np.float16])
def test_half_precision_files_keep_their_dtype_or_cast(tmp_path: Path, file_dtype: Any) -> None:
    tensors = make_tensors(4, file_dtype)
    model = from_pretrained(write(tmp_path, tensors))
    assert model.embed.weight.dtype == jnp.dtype(file_dtype)
    assert model.blocks.layers.bias.dtype == jnp.dtype(file_dtype)
    full = from_pretrained(tmp_path, dtype=jnp.float32)
    assert full.embed.weight.dtype == jnp.float32
    np.testing.assert_array_equal(full.embed.weight, tensors["embed.weight"].astype(np.float32))
    assert_close(full, {k: v.astype(np.float32) for k, v in tensors.items()})


def test_float32_file_cast_to_bfloat16_on_load(tmp_path: Path) -> None:
    tensors = make_tensors(5)
    model = from_pretrained(write(tmp_path, tensors), dtype="bfloat16")
    np.testing.assert_array_equal(
        np.asarray(model.blocks.layers.weight[1]),
        tensors["blocks.1.weight"].astype(ml_dtypes.bfloat16),
    )


def test_strict_names_every_problem_and_its_file_in_one_error(tmp_path: Path) -> None:
    tensors = make_tensors(6)
    del tensors["norm.bias"]
    tensors["blocks.1.weight"] = tensors["blocks.1.weight"][:, :4].copy()
    tensors["extra.weight"] = np.zeros(3, np.float32)
    write_sharded(tmp_path, tensors)
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(tmp_path)
    text = str(info.value)
    assert "TinyTiedModel" in text and str(tmp_path) in text
    assert "missing (1): norm.bias" in text
    assert "unexpected (1): extra.weight" in text
    assert "blocks.1.weight: found float32[8,4], the model needs float32[8,8]" in text
    assert "extra.weight is in model-0000" in text and "blocks.1.weight is in model-0000" in text


def test_partial_load_reports_and_keeps_initial_values(tmp_path: Path) -> None:
    tensors = make_tensors(7)
    del tensors["norm.weight"]
    tensors["unused"] = np.ones(2, np.float32)
    model, report = from_pretrained(write(tmp_path, tensors), strict=False, key=jax.random.key(3))
    assert report.missing == ("norm.weight",) and report.unexpected == ("unused",)
    assert not report.complete and report.mismatched == ()
    np.testing.assert_array_equal(model.norm.weight, np.ones(DIM, np.float32))  # LayerNorm init
    np.testing.assert_array_equal(model.blocks.layers.weight[0], tensors["blocks.0.weight"])


def test_complete_partial_load_returns_an_empty_report(tmp_path: Path) -> None:
    model, report = from_pretrained(write(tmp_path, make_tensors()), strict=False)
    assert report.complete


# Damaged directories. ---------------------------------------------------------------------------


def test_no_config_json(tmp_path: Path) -> None:
    save_file(make_tensors(), str(tmp_path / "model.safetensors"))
    with pytest.raises(tm.CheckpointError, match=r"config\.json does not exist"):
        from_pretrained(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(tm.CheckpointError, match="is not a directory"):
        from_pretrained(tmp_path / "nowhere")


def test_config_without_architectures(tmp_path: Path) -> None:
    write(tmp_path, make_tensors(), {"model_type": "gpt2"})
    with pytest.raises(tm.CheckpointError, match=r"config\.json has no 'architectures'"):
        from_pretrained(tmp_path)


def test_unknown_architecture_names_it_and_the_known_ones(tmp_path: Path) -> None:
    write(tmp_path, make_tensors(), {**CONFIG, "architectures": ["FalconForCausalLM"]})
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(tmp_path)
    text = str(info.value)
    assert "config.json" in text and "'FalconForCausalLM'" in text and "TreemodTestTinyTied" in text


def test_config_not_json(tmp_path: Path) -> None:
    write(tmp_path, make_tensors())
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(tm.CheckpointError, match=r"config\.json is not valid JSON"):
        from_pretrained(tmp_path)


def test_no_weights(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(tm.CheckpointError, match=r"neither model\.safetensors nor"):
        from_pretrained(tmp_path)


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    write_sharded(tmp_path, make_tensors())
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(tmp_path)
    text = str(info.value)
    assert "index.json names shard 'model-00002-of-00002.safetensors'" in text
    assert "'blocks.0.weight'" in text and "does not exist" in text


def test_index_disagreeing_with_its_shards(tmp_path: Path) -> None:
    write_sharded(tmp_path, make_tensors())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(tm.CheckpointError, match=r"puts tensor 'ghost\.weight' in 'model-00001"):
        from_pretrained(tmp_path)


def test_truncated_shard_names_the_file_and_the_tensors_cut_off(tmp_path: Path) -> None:
    write(tmp_path, make_tensors())
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 40])
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(tmp_path)
    text = str(info.value)
    assert str(file) in text and "truncated" in text
    assert "'norm.weight'" in text  # the last tensor in the file (names sorted by safetensors)


def test_damaged_header_names_the_file(tmp_path: Path) -> None:
    write(tmp_path, make_tensors())
    file = tmp_path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[8:12] = b"{{{{"
    file.write_bytes(bytes(data))
    with pytest.raises(
        tm.CheckpointError, match=rf"{file}.* is damaged: its header is not valid JSON"
    ):
        from_pretrained(tmp_path)


def test_remat_reaches_every_stack_and_keeps_gradients(tmp_path: Path) -> None:
    from treemod.models import LlamaForCausalLM, save_pretrained

    config = {
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    save_pretrained(LlamaForCausalLM.from_config(config, key=jax.random.key(0)), tmp_path)
    plain = from_pretrained(tmp_path)
    dots = from_pretrained(tmp_path, remat="dots")
    assert plain.model.layers.remat is False and dots.model.layers.remat == "dots"

    def loss(model: Any, ids: Any) -> Any:
        return jnp.sum(model(input_ids=ids) ** 2)

    ids = jnp.array([[1, 5, 9, 3]])
    want = tm.filter_jit(tm.filter_grad(loss))(plain, ids)
    got = tm.filter_jit(tm.filter_grad(loss))(dots, ids)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    jaxpr = str(jax.make_jaxpr(lambda: tm.filter_grad(loss)(dots, ids))())
    assert "checkpoint" in jaxpr or "remat" in jaxpr
    with pytest.raises(Exception, match="remat"):
        from_pretrained(tmp_path, remat="sometimes")
