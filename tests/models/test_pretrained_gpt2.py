"""GPT-2 through Hugging Face directories, both ways, against `transformers` itself.

`transformers`' randomly initialised GPT-2 (a tiny config) is saved with its own
`save_pretrained` and loaded with treemod's `from_pretrained`, and the other way round; the
logits agree within 1e-5 relative (max abs error over max abs value), and `transformers` reports
no missing, unexpected or mismatched keys for treemod's directories. Sharded directories and
bfloat16/float16 files too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

import treemod as tm
from treemod.models import GPT2LMHeadModel, GPT2Model, from_pretrained, save_pretrained

CONFIG = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 96, "n_positions": 32}
IDS = np.array([[5, 17, 3, 90, 1, 0, 44], [2, 2, 7, 8, 61, 30, 9]])


def _hf(cls: Any = transformers.GPT2LMHeadModel, **changes: Any) -> Any:
    torch.manual_seed(0)
    model = cls(transformers.GPT2Config(**{**CONFIG, **changes})).eval()
    with torch.no_grad():  # random LayerNorm parameters too, so that their names matter
        for name, p in model.named_parameters():
            if "ln" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def _hf_out(model: Any) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(IDS))
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return value.float().numpy()


def _assert_close(got: Any, want: np.ndarray, rtol: float = 1e-5) -> None:
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert error <= rtol, error


@pytest.fixture(scope="module")
def hf_model() -> Any:
    return _hf()


@pytest.fixture(scope="module")
def hf_dir(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf-gpt2")
    hf_model.save_pretrained(directory)
    return directory


def test_transformers_directory_loads_with_the_same_logits(hf_model: Any, hf_dir: Path) -> None:
    model = from_pretrained(hf_dir)
    assert isinstance(model, GPT2LMHeadModel)
    _assert_close(model(input_ids=IDS), _hf_out(hf_model))
    # One array for the tied head: transformers writes only the embedding.
    assert model.lm_head is None
    np.testing.assert_array_equal(
        model.transformer.wte.weight, hf_model.lm_head.weight.detach().numpy()
    )


def _hf_load(directory: Path, cls: Any = transformers.GPT2LMHeadModel, **kw: Any) -> Any:
    model, info = cls.from_pretrained(directory, output_loading_info=True, **kw)
    assert info["missing_keys"] == set() or not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert not info.get("error_msgs"), info
    return model.eval()


def test_treemod_directory_loads_in_transformers_with_no_key_problems(
    hf_model: Any, hf_dir: Path, tmp_path: Path
) -> None:
    model = from_pretrained(hf_dir)
    save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["model_type"] == "gpt2"
    reloaded = _hf_load(tmp_path)
    _assert_close(_hf_out(reloaded), _hf_out(hf_model))
    for name, value in hf_model.state_dict().items():
        np.testing.assert_array_equal(reloaded.state_dict()[name].numpy(), value.numpy())


def test_sharded_both_ways(hf_model: Any, tmp_path: Path) -> None:
    hf_model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    model = from_pretrained(tmp_path / "hf")
    _assert_close(model(input_ids=IDS), _hf_out(hf_model))
    save_pretrained(model, tmp_path / "tm", max_shard_size="20KB")
    index = json.loads((tmp_path / "tm" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    _assert_close(_hf_out(_hf_load(tmp_path / "tm")), _hf_out(hf_model))


@pytest.mark.parametrize("torch_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_files(hf_model: Any, tmp_path: Path, torch_dtype: Any) -> None:
    half = _hf().to(torch_dtype)
    half.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    np_dtype = ml_dtypes.bfloat16 if torch_dtype == torch.bfloat16 else np.float16
    weight = model.transformer.h.layers.attn.c_attn.weight
    assert weight.dtype == jnp.dtype(np_dtype)
    want = half.transformer.h[1].attn.c_attn.weight.detach().float().numpy()
    np.testing.assert_array_equal(np.asarray(weight[1], np.float32), want)
    # Cast on load: the same as transformers loading the half-precision file in float32.
    full = from_pretrained(tmp_path / "hf", dtype=jnp.float32)
    reference = _hf_load(tmp_path / "hf", dtype=torch.float32)
    _assert_close(full(input_ids=IDS), _hf_out(reference))
    # Saved back in half precision, transformers reads the same values.
    save_pretrained(model, tmp_path / "tm")
    config = json.loads((tmp_path / "tm" / "config.json").read_text())
    assert config["dtype"] == str(torch_dtype).removeprefix("torch.")
    back = _hf_load(tmp_path / "tm", dtype=torch_dtype)
    for name, value in half.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


def test_untied_head_and_base_model(tmp_path: Path) -> None:
    untied = _hf(tie_word_embeddings=False)
    untied.save_pretrained(tmp_path / "untied")
    model = from_pretrained(tmp_path / "untied")
    assert model.lm_head is not None and model.tied_weights() == {}
    _assert_close(model(input_ids=IDS), _hf_out(untied))
    save_pretrained(model, tmp_path / "untied-tm")
    _assert_close(_hf_out(_hf_load(tmp_path / "untied-tm")), _hf_out(untied))

    base = _hf(transformers.GPT2Model)
    base.save_pretrained(tmp_path / "base")
    loaded = from_pretrained(tmp_path / "base")
    assert isinstance(loaded, GPT2Model)
    _assert_close(loaded(input_ids=IDS), _hf_out(base))
    save_pretrained(loaded, tmp_path / "base-tm")
    _assert_close(_hf_out(_hf_load(tmp_path / "base-tm", transformers.GPT2Model)), _hf_out(base))


def test_a_directory_of_another_config_is_refused_by_name(hf_dir: Path, tmp_path: Path) -> None:
    bigger = _hf(n_layer=3)
    bigger.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_layer"] = 2  # the config says 2 layers, the weights hold 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(tm.CheckpointError) as info:
        from_pretrained(tmp_path)
    assert "unexpected (12): transformer.h.2.attn.c_attn.bias" in str(info.value)
