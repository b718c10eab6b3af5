"""ViT (`ViTModel`, `ViTForImageClassification`) against `transformers`.

Reference: `transformers`' own classes, random-initialised from small configs (32x32 images) in
`eval()` mode; weights move with `tm.load_state_dict(model, hf_model.state_dict())` and back
with `tm.state_dict`. Float32 outputs agree within 1e-5 relative (max abs error over max abs
value). Hypothesis covers the config values the classes read; refused values raise a
`CheckpointError` naming the class and the key.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

import treemod as tm
from treemod.models import ViTForImageClassification, ViTModel, from_pretrained, save_pretrained

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

CLASSES = {
    "ViTModel": (ViTModel, transformers.ViTModel),
    "ViTForImageClassification": (
        ViTForImageClassification,
        transformers.ViTForImageClassification,
    ),
}
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "image_size": 32,
    "patch_size": 8,
    "num_labels": 5,
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})


def _relative_error(got: Any, ref: torch.Tensor) -> float:
    ref_np = ref.detach().numpy()
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return CLASSES[name][1](transformers.ViTConfig(**config)).eval()


def _ours(name: str, hf_model: Any) -> Any:
    config = json.loads(hf_model.config.to_json_string())
    # A shape-only skeleton, filled by load_state_dict: no random initialiser to compile
    # per new shape (seconds per hypothesis example).
    cls = CLASSES[name][0]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, hf_model.state_dict())


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any]) -> jax.Array:
    return model(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _pixels(rng: np.random.Generator, batch: int, config: dict[str, Any]) -> np.ndarray:
    size = config["image_size"]
    h, w = size if isinstance(size, list) else (size, size)
    shape = (batch, config.get("num_channels", 3), h, w)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)
    inputs = {"pixel_values": _pixels(np.random.default_rng(0), 2, TINY)}
    ref = _reference(hf, inputs)
    got = _run(model, inputs)
    assert got.shape == tuple(ref.shape)
    assert _relative_error(got, ref) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_state_dict_names_are_transformers_names(name: str) -> None:
    model = CLASSES[name][0].from_config(TINY, key=jax.random.key(0))
    names = set(tm.state_dict(model))
    assert names == set(_hf(name, TINY).state_dict())
    # ViTModel has a pooler by default; the classifier's inner model has none.
    assert ("pooler.dense.weight" in names) == (name == "ViTModel")


def test_round_trip_treemod_to_transformers_with_attention_mask() -> None:
    model = ViTModel.from_config(TINY, key=jax.random.key(3))
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in tm.state_dict(model).items()}
    hf = _hf("ViTModel", TINY)
    hf.load_state_dict(tensors, strict=True)
    rng = np.random.default_rng(1)
    mask = np.ones((2, 17), np.int64)
    mask[1, 9:] = 0
    inputs = {"pixel_values": _pixels(rng, 2, TINY), "attention_mask": mask}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    patch = data.draw(st.sampled_from([4, 8, [8, 4]]), "patch")
    config = {
        "hidden_size": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "num_hidden_layers": data.draw(st.integers(1, 2), "layers"),
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 40), "intermediate"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "pooler_act": data.draw(st.sampled_from(ACTS), "pooler_act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-6, 1e-2]), "eps"),
        "image_size": data.draw(st.sampled_from([16, 32, [16, 24]]), "image"),
        "patch_size": patch,
        "num_channels": data.draw(st.integers(1, 4), "channels"),
        "qkv_bias": data.draw(st.booleans(), "qkv_bias"),
        "pooler_output_size": data.draw(st.sampled_from([None, 12]), "pooler_size"),
        "num_labels": data.draw(st.integers(0, 4), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    inputs = {"pixel_values": _pixels(rng, data.draw(st.integers(1, 2), "batch"), config)}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    """transformers' files keep ViT's older names (encoder.layer.0.attention.attention.query);
    from_pretrained reads them, and transformers reads what save_pretrained writes."""
    hf = _hf(name, TINY)
    hf.save_pretrained(tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert any(".attention.attention.query." in k for k in tensors)
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = {"pixel_values": _pixels(np.random.default_rng(5), 1, TINY)}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs)) < 1e-5


def test_explicit_head_dim_is_read() -> None:
    config = {**TINY, "head_dim": 4}  # 4 heads of 4: the projections are 32 -> 16
    hf = _hf("ViTModel", config)
    assert hf.layers[0].attention.q_proj.weight.shape == (16, 32)
    model = _ours("ViTModel", hf)
    inputs = {"pixel_values": _pixels(np.random.default_rng(4), 1, config)}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (ViTModel, "hidden_act", "prelu"),
        (ViTForImageClassification, "pooler_act", "xielu"),
        (ViTModel, "image_size", [32, 32, 3]),
        (ViTForImageClassification, "patch_size", 0),
        (ViTModel, "patch_size", 64),
        (ViTModel, "layer_norm_eps", -1.0),
        (ViTModel, "qkv_bias", "yes"),
        (ViTForImageClassification, "attention_probs_dropout_prob", 2.0),
        (ViTModel, "head_dim", 0),
        (ViTForImageClassification, "num_labels", -1),
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


@pytest.mark.parametrize("size", [(48, 48), (16, 40), (32, 32)])
def test_interpolate_pos_encoding_equals_transformers(size: tuple[int, int]) -> None:
    """Other sizes with interpolate_pos_encoding=True: transformers resizes the positions with
    PyTorch's bicubic kernel, and so does treemod."""
    hf = _hf("ViTForImageClassification", TINY)
    model = _ours("ViTForImageClassification", hf)
    pixels = np.random.default_rng(8).standard_normal((2, 3, *size)).astype(np.float32)
    with torch.inference_mode():
        want = hf(pixel_values=torch.from_numpy(pixels), interpolate_pos_encoding=True).logits
    got = _run(model, {"pixel_values": pixels, "interpolate_pos_encoding": True})
    assert _relative_error(got, want) < 1e-5


def test_other_image_sizes_without_interpolation_are_refused() -> None:
    model = ViTForImageClassification.from_config(TINY, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"pixel_values has shape \(1, 3, 48, 48\)"):
        model(pixel_values=np.zeros((1, 3, 48, 48), np.float32))
    pair = ViTModel.from_config({**TINY, "patch_size": [8, 8]}, key=jax.random.key(0))
    with pytest.raises(ValueError, match="interpolate_pos_encoding needs an int patch_size"):
        pair(pixel_values=np.zeros((1, 3, 48, 48), np.float32), interpolate_pos_encoding=True)


def test_builds_under_filter_eval_shape_and_in_bfloat16() -> None:
    shapes = tm.filter_eval_shape(
        lambda: ViTModel.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    )
    assert shapes.embeddings.position_embeddings.shape == (1, 17, 32)
    assert shapes.embeddings.cls_token.dtype == jnp.bfloat16
    model = ViTForImageClassification.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, {"pixel_values": _pixels(np.random.default_rng(0), 1, TINY)})
    assert out.dtype == jnp.bfloat16 and out.shape == (1, 5)
