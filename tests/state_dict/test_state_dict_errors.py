"""Bad state dicts: every missing, unexpected, mis-shaped and dtype-incompatible tensor named in
one `CheckpointError` (with the file, for a path), nothing loaded; `strict=False` loads what
fits and reports the rest; unreadable files and layers PyTorch cannot mirror are refused by
name."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch

import treemod as tm
import treemod.nn as nn


class Small(tm.Module):
    fc: nn.Linear
    bn: nn.BatchNorm

    def __init__(self) -> None:
        self.fc = nn.Linear(3, 4, key=jax.random.key(0))
        self.bn = nn.BatchNorm(4)


def good() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "fc.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "fc.bias": rng.standard_normal(4).astype(np.float32),
        "bn.weight": rng.standard_normal(4).astype(np.float32),
        "bn.bias": rng.standard_normal(4).astype(np.float32),
        "bn.running_mean": rng.standard_normal(4).astype(np.float32),
        "bn.running_var": rng.uniform(1, 2, 4).astype(np.float32),
        "bn.num_batches_tracked": np.array(3, np.int64),
    }


def damaged() -> dict[str, np.ndarray]:
    sd = good()
    del sd["fc.bias"]
    sd["extra.weight"] = np.zeros(2, np.float32)
    sd["fc.weight"] = sd["fc.weight"].T.copy()
    sd["bn.num_batches_tracked"] = np.array(3.0, np.float32)
    return sd


def test_every_problem_in_one_error() -> None:
    model = Small()
    with pytest.raises(tm.CheckpointError) as info:
        tm.load_state_dict(model, damaged())
    text = str(info.value)
    assert "load_state_dict(Small): the state dict does not match the model" in text
    assert "missing (1): fc.bias" in text
    assert "unexpected (1): extra.weight" in text
    assert "fc.weight: found float32[3,4], the model needs float32[4,3]" in text
    assert "bn.num_batches_tracked: found float32[], the model needs int32[]" in text
    assert "cannot hold float32 values" in text
    assert "Nothing was loaded" in text and "strict=False" in text


def test_float_into_int_and_int_into_float_are_refused() -> None:
    sd = good()
    sd["fc.weight"] = np.ones((4, 3), np.int64)
    with pytest.raises(tm.CheckpointError, match=r"fc\.weight: found int64\[4,3\].*float32"):
        tm.load_state_dict(Small(), sd)


def test_non_strict_loads_what_fits_and_reports_the_rest() -> None:
    model = Small()
    sd = damaged()
    loaded, report = tm.load_state_dict(model, sd, strict=False)
    assert report.missing == ("fc.bias",)
    assert report.unexpected == ("extra.weight",)
    assert [m.name for m in report.mismatched] == ["bn.num_batches_tracked", "fc.weight"]
    assert report.mismatched[1].found_shape == (3, 4)
    assert report.mismatched[1].expected_shape == (4, 3)
    assert not report.complete and report.source is None
    # Loaded where it fits; the model's own values where it does not.
    np.testing.assert_array_equal(np.asarray(loaded.bn.weight), sd["bn.weight"])
    np.testing.assert_array_equal(np.asarray(loaded.fc.bias), np.asarray(model.fc.bias))
    np.testing.assert_array_equal(np.asarray(loaded.fc.weight), np.asarray(model.fc.weight))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.missing = ()  # type: ignore[misc]
    _, clean = tm.load_state_dict(model, good(), strict=False)
    assert clean.complete and clean.describe() == ""


def test_the_error_names_the_file(tmp_path: Any) -> None:
    path = tmp_path / "small.safetensors"
    safetensors.numpy.save_file(damaged(), str(path))
    with pytest.raises(tm.CheckpointError) as info:
        tm.load_state_dict(Small(), path)
    text = str(info.value)
    assert f"load_state_dict(Small): {path} does not match the model" in text
    assert "missing (1): fc.bias" in text and "unexpected (1): extra.weight" in text
    _, report = tm.load_state_dict(Small(), path, strict=False)
    assert report.source == str(path)


def test_sharded_files_name_the_file_of_each_tensor(tmp_path: Any) -> None:
    sd = damaged()
    one, two = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors.numpy.save_file({k: v for k, v in sd.items() if k.startswith("fc")}, str(one))
    safetensors.numpy.save_file({k: v for k, v in sd.items() if not k.startswith("fc")}, str(two))
    with pytest.raises(tm.CheckpointError) as info:
        tm.load_state_dict(Small(), [one, two])
    text = str(info.value)
    assert f"fc.weight is in {one}" in text and f"extra.weight is in {two}" in text
    safetensors.numpy.save_file({"fc.weight": np.zeros((4, 3), np.float32)}, str(two))
    with pytest.raises(tm.CheckpointError, match=r"tensor 'fc.weight' is in both .*a\.safetensors"):
        tm.load_state_dict(Small(), [one, two])


def test_unreadable_files(tmp_path: Any) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    damaged = r"bad\.safetensors is damaged: its header says 16 bytes.*not a readable safetensors"
    with pytest.raises(tm.CheckpointError, match=damaged):
        tm.load_state_dict(Small(), bad)
    with pytest.raises(tm.CheckpointError, match=r"nope\.safetensors is not a file"):
        tm.load_state_dict(Small(), tmp_path / "nope.safetensors")
    with pytest.raises(TypeError, match=r"`state_dict` must be a mapping .* got int"):
        tm.load_state_dict(Small(), 3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"keys must be strings .* got 0"):
        tm.load_state_dict(Small(), {0: np.zeros(1)})


def test_sources_cast_to_the_models_dtypes() -> None:
    """bfloat16 torch tensors, float64 NumPy arrays and JAX arrays load, cast to float32."""
    sd: dict[str, Any] = dict(good())
    weight = torch.randn(4, 3).to(torch.bfloat16)
    sd["fc.weight"] = weight
    sd["fc.bias"] = sd["fc.bias"].astype(np.float64)
    sd["bn.weight"] = jnp.asarray(sd["bn.weight"])
    loaded = tm.load_state_dict(Small(), sd)
    assert loaded.fc.weight.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(loaded.fc.weight), weight.float().numpy())
    np.testing.assert_array_equal(np.asarray(loaded.fc.bias), sd["fc.bias"].astype(np.float32))


def test_loading_into_an_abstract_model() -> None:
    """A skeleton from `filter_eval_shape` (no arrays allocated) loads strictly into a model."""
    skeleton = tm.filter_eval_shape(Small)
    loaded = tm.load_state_dict(skeleton, good())
    np.testing.assert_array_equal(np.asarray(loaded.fc.weight), good()["fc.weight"])
    with pytest.raises(ValueError, match=r"state_dict: tensor 'fc.weight' has no value"):
        tm.state_dict(skeleton)
    partial = good()
    del partial["fc.bias"]
    loaded, report = tm.load_state_dict(skeleton, partial, strict=False)
    assert report.missing == ("fc.bias",)
    assert isinstance(loaded.fc.bias, jax.ShapeDtypeStruct)
    np.testing.assert_array_equal(np.asarray(loaded.bn.bias), partial["bn.bias"])


def test_layers_pytorch_cannot_mirror_are_refused_by_name() -> None:
    key = jax.random.key(0)
    mha = {"attn": nn.MultiheadAttention(2, 8, use_query_bias=True, key=key)}
    with pytest.raises(
        tm.CheckpointError,
        match=r"MultiheadAttention at 'attn': PyTorch's MultiheadAttention has biases on all "
        r"three input projections or on none, but this one has use_query_bias=True",
    ):
        tm.state_dict(mha)
    with pytest.raises(tm.CheckpointError, match=r"MultiheadAttention at 'attn'"):
        tm.load_state_dict(mha, {})
    sn = [nn.SpectralNorm(nn.ConvTranspose2d(2, 3, 2, key=key), key=key)]
    with pytest.raises(
        tm.CheckpointError,
        match=r"SpectralNorm at '0': SpectralNorm of a ConvTranspose2d has no PyTorch twin: "
        r"PyTorch stores its 'weight' in another layout",
    ):
        tm.state_dict(sn)
    wn = {"wn": nn.WeightNorm(nn.Conv2d(2, 3, 2, key=key, channels_last=True))}
    with pytest.raises(
        tm.CheckpointError,
        match=r"WeightNorm at 'wn': WeightNorm of a Conv2d \(channels_last=True\)",
    ):
        tm.load_state_dict(wn, {})


def test_two_tensors_under_one_name_are_refused() -> None:
    model = {"fc": {"weight": jnp.ones(2)}, "fc.weight": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"two tensors of the model are named 'fc.weight'"):
        tm.state_dict(model)


def test_loaded_arrays_do_not_alias_the_source() -> None:
    """Training the PyTorch model on (in place) after loading leaves the treemod model alone."""
    ref = torch.nn.Linear(64, 64)
    sd = {"weight": ref.weight, "bias": ref.bias.detach().numpy()}
    loaded = tm.load_state_dict(nn.Linear(64, 64, key=jax.random.key(0)), sd)
    before = np.array(loaded.weight), np.array(loaded.bias)
    with torch.no_grad():
        ref.weight.add_(1.0)
        ref.bias.add_(1.0)
    np.testing.assert_array_equal(np.asarray(loaded.weight), before[0])
    np.testing.assert_array_equal(np.asarray(loaded.bias), before[1])
