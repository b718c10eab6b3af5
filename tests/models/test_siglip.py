"""SigLIP (`SiglipModel`, `SiglipTextModel`, `SiglipVisionModel`, `SiglipForImageClassification`)
against `transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in `eval()` mode;
weights move with `tm.load_state_dict(model, hf_model.state_dict())` and through
`save_pretrained` directories both ways. Float32 outputs agree within 1e-5 relative (max abs
error over max abs value); padded batches on the real tokens.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models.siglip import (
    SiglipForImageClassification,
    SiglipModel,
    SiglipTextModel,
    SiglipVisionModel,
)

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

TEXT = {
    "vocab_size": 99,
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 12,
    "eos_token_id": 98,
    "bos_token_id": 97,
    "pad_token_id": 1,
}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
}
FULL = {"text_config": TEXT, "vision_config": VISION, "num_labels": 3}
# name: (ours, transformers' class, its config class, config, kind of input, output field)
CLASSES: dict[str, tuple[Any, Any, Any, dict[str, Any], str, str]] = {
    "SiglipTextModel": (
        SiglipTextModel,
        transformers.SiglipTextModel,
        transformers.SiglipTextConfig,
        TEXT,
        "text",
        "last_hidden_state",
    ),
    "SiglipVisionModel": (
        SiglipVisionModel,
        transformers.SiglipVisionModel,
        transformers.SiglipVisionConfig,
        VISION,
        "image",
        "last_hidden_state",
    ),
    "SiglipModel": (
        SiglipModel,
        transformers.SiglipModel,
        transformers.SiglipConfig,
        FULL,
        "both",
        "logits_per_image",
    ),
    "SiglipForImageClassification": (
        SiglipForImageClassification,
        transformers.SiglipForImageClassification,
        transformers.SiglipConfig,
        FULL,
        "image",
        "logits",
    ),
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})


def _relative_error(got: Any, ref: Any) -> float:
    ref_np = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    entry = CLASSES[name]
    return entry[1](entry[2].from_dict(config)).eval()


def _ours(name: str, hf_model: Any) -> Any:
    config = json.loads(hf_model.config.to_json_string())
    cls = CLASSES[name][0]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, hf_model.state_dict())


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any], method: str = "__call__") -> Any:
    return getattr(model, method)(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray], field: str) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return getattr(out, field)


def _ids(rng: np.random.Generator, batch: int, seq: int, text: dict[str, Any]) -> np.ndarray:
    ids = rng.integers(2, text["vocab_size"] - 3, (batch, seq))
    ids[:, -1] = text.get("eos_token_id", text["vocab_size"] - 1)
    return ids


def _pixels(rng: np.random.Generator, batch: int, vision: dict[str, Any]) -> np.ndarray:
    size = vision["image_size"]
    return rng.standard_normal((batch, vision.get("num_channels", 3), size, size)).astype(
        np.float32
    )


def _inputs(name: str, config: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    kind = CLASSES[name][4]
    text, vision = config.get("text_config", config), config.get("vision_config", config)
    inputs: dict[str, Any] = {}
    if kind in ("text", "both"):
        inputs["input_ids"] = _ids(rng, 3, 7, text)
    if kind in ("image", "both"):
        inputs["pixel_values"] = _pixels(rng, 2, vision)
    return inputs


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers(name: str) -> None:
    config = CLASSES[name][3]
    hf = _hf(name, config)
    model = _ours(name, hf)
    inputs = _inputs(name, config, np.random.default_rng(0))
    ref = _reference(hf, inputs, CLASSES[name][5])
    got = _run(model, inputs)
    assert got.shape == tuple(ref.shape)
    assert _relative_error(got, ref) < 1e-5
    if name in ("SiglipTextModel", "SiglipVisionModel"):
        pooled = _run(model, inputs, "pooler_output")
        assert _relative_error(pooled, _reference(hf, inputs, "pooler_output")) < 1e-5
    if name == "SiglipModel":
        per_image, per_text = _run(model, inputs, "logits")
        assert _relative_error(per_text, _reference(hf, inputs, "logits_per_text")) < 1e-5
        for method, field in [("get_text_features", "text"), ("get_image_features", "image")]:
            kind = {"text": ("input_ids",), "image": ("pixel_values",)}[field]
            part = {k: v for k, v in inputs.items() if k in kind}
            with torch.inference_mode():
                want = getattr(hf, method)(**{k: torch.from_numpy(v) for k, v in part.items()})
            assert _relative_error(_run(model, part, method), want.pooler_output) < 1e-5


def test_padded_batch_equals_transformers_on_real_tokens() -> None:
    """SigLIP's text tower is bidirectional: padded keys are masked out (left or right)."""
    hf = _hf("SiglipTextModel", TEXT)
    model = _ours("SiglipTextModel", hf)
    rng = np.random.default_rng(1)
    ids = _ids(rng, 3, 8, TEXT)
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = TEXT["pad_token_id"]
    inputs = {"input_ids": ids, "attention_mask": mask}
    ref = _reference(hf, inputs, "last_hidden_state").numpy()
    got = np.asarray(_run(model, inputs))
    real = mask.astype(bool)
    assert _relative_error(got[real], ref[real]) < 1e-5
    pooled = _run(model, inputs, "pooler_output")
    assert _relative_error(pooled, _reference(hf, inputs, "pooler_output")) < 1e-5
    for row in range(3):
        where = np.nonzero(real[row])[0][None]
        alone = {"input_ids": ids[row : row + 1, real[row]], "position_ids": where}
        one = np.asarray(_run(model, alone))[0]
        assert _relative_error(got[row, real[row]], one) < 1e-5


def test_vision_tower_without_head() -> None:
    config = {**VISION, "vision_use_head": False}
    hf = _hf("SiglipVisionModel", config)
    assert not any(n.startswith("head.") for n in hf.state_dict())
    model = _ours("SiglipVisionModel", hf)
    inputs = _inputs("SiglipVisionModel", config, np.random.default_rng(3))
    assert _relative_error(_run(model, inputs), _reference(hf, inputs, "last_hidden_state")) < 1e-5
    with pytest.raises(ValueError, match="vision_use_head"):
        model.pooler_output(**inputs)


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    def tower(prefix: str) -> dict[str, Any]:
        heads = data.draw(st.sampled_from([1, 2, 4]), prefix + "heads")
        return {
            "hidden_size": heads * data.draw(st.sampled_from([4, 8]), prefix + "head_dim"),
            "intermediate_size": data.draw(st.integers(4, 40), prefix + "intermediate"),
            "num_hidden_layers": data.draw(st.integers(1, 2), prefix + "layers"),
            "num_attention_heads": heads,
            "hidden_act": data.draw(st.sampled_from(ACTS), prefix + "act"),
            "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-5, 1e-2]), prefix + "eps"),
        }

    text = {
        **tower("text_"),
        "vocab_size": 99,
        "max_position_embeddings": data.draw(st.integers(7, 12), "positions"),
        "bos_token_id": 97,  # within the vocabulary (transformers logs otherwise)
        "eos_token_id": 98,
    }
    vision = {
        **tower("vision_"),
        "image_size": data.draw(st.sampled_from([8, 12, 16]), "image"),
        "patch_size": data.draw(st.sampled_from([4, 8]), "patch"),
        "num_channels": data.draw(st.integers(1, 4), "channels"),
        "vision_use_head": data.draw(st.booleans(), "use_head"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    if CLASSES[name][3] is FULL:  # SiglipModel compares the pooled embeddings
        vision["hidden_size"] = text["hidden_size"]
        vision["num_attention_heads"] = text["num_attention_heads"]
        if name == "SiglipModel":
            vision["vision_use_head"] = True
    if data.draw(st.booleans(), "projection_size") and name != "SiglipModel":
        text["projection_size"] = data.draw(st.integers(1, 9), "projection")
    tower_config = {"text": text, "image": vision}.get(CLASSES[name][4])
    config = (
        tower_config
        if CLASSES[name][3] is not FULL
        else {
            "text_config": text,
            "vision_config": vision,
            # transformers' SiglipForImageClassification fails to initialise with 0 labels
            "num_labels": data.draw(st.integers(1, 4), "labels"),
        }
    )
    hf = _hf(name, config)
    model = _ours(name, hf)
    inputs = _inputs(name, config, np.random.default_rng(data.draw(st.integers(0, 99), "seed")))
    ref = _reference(hf, inputs, CLASSES[name][5])
    assert _relative_error(_run(model, inputs), ref) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    config = CLASSES[name][3]
    hf = _hf(name, config)
    hf.save_pretrained(tmp_path / "hf")
    files = set(load_file(str(tmp_path / "hf" / "model.safetensors")))
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = _inputs(name, config, np.random.default_rng(5))
    field = CLASSES[name][5]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs, field)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    assert set(load_file(str(tmp_path / "ours" / "model.safetensors"))) == files
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs, field)) < 1e-5


@pytest.mark.parametrize("name", ["SiglipModel", "SiglipVisionModel"])
def test_old_files_with_position_ids_and_tower_prefix_load(name: str, tmp_path: Any) -> None:
    """transformers 4 wrote `position_ids` buffers, and a tower's tensors under `vision_model.`;
    both load as transformers 5 loads them (buffers skipped, prefix removed)."""
    config = CLASSES[name][3]
    hf = _hf(name, config)
    hf.save_pretrained(tmp_path)
    path = str(tmp_path / "model.safetensors")
    tensors = load_file(path)
    if name == "SiglipVisionModel":
        tensors = {f"vision_model.{k}": v for k, v in tensors.items()}
    tensors["vision_model.embeddings.position_ids"] = np.arange(16)[None]
    if name == "SiglipModel":
        tensors["text_model.embeddings.position_ids"] = np.arange(12)[None]
    save_file(tensors, path, metadata={"format": "pt"})
    again, info = CLASSES[name][1].from_pretrained(tmp_path, output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"])
    model = from_pretrained(tmp_path)
    inputs = _inputs(name, config, np.random.default_rng(6))
    field = CLASSES[name][5]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs, field)) < 1e-5


def _randomise_peft_b(peft_model: Any) -> None:
    """PEFT starts B at zero: random B, so that the adapters change the outputs."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


# PEFT reads transformers' deprecated `is_gradient_checkpointing` (PEFT's use, not ours).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_lora_adapter_loads_into_treemod(tmp_path: Any) -> None:
    """PEFT's q_proj/v_proj adapters on both towers load into treemod's SiglipModel.

    (treemod's `save_adapter` fails on a model with a top-level tensor such as `logit_bias`,
    a bug of `treemod.lora`, so this direction is the one tested.)"""
    hf = _hf("SiglipModel", FULL)
    model = _ours("SiglipModel", hf)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    reference = peft.get_peft_model(hf, config).eval()
    _randomise_peft_b(reference)
    reference.save_pretrained(str(tmp_path))
    tuned = lora.load_adapter(model, tmp_path)
    # q_proj and v_proj of 2 + 2 layers; the pooling head's attention is torch's, untargeted
    assert sum(".lora_B." in n for n in tm.state_dict(tuned)) == 8
    inputs = _inputs("SiglipModel", FULL, np.random.default_rng(7))
    want = _reference(reference, inputs, "logits_per_image")
    assert _relative_error(_run(tuned, inputs), want) < 1e-5
    assert _relative_error(_run(model, inputs), want) > 1e-3


@pytest.mark.parametrize(
    ("cls", "config", "key", "value"),
    [
        (SiglipTextModel, TEXT, "hidden_act", "prelu"),
        (SiglipTextModel, TEXT, "num_attention_heads", 5),
        (SiglipTextModel, TEXT, "projection_size", 0),
        (SiglipTextModel, TEXT, "attention_dropout", 2.0),
        (SiglipVisionModel, VISION, "image_size", [16, 16]),
        (SiglipVisionModel, VISION, "patch_size", 32),
        (SiglipVisionModel, VISION, "vision_use_head", "yes"),
        (SiglipVisionModel, VISION, "layer_norm_eps", 0),
        (SiglipForImageClassification, FULL, "num_labels", -1),
    ],
)
def test_refused_config_values_name_class_and_key(
    cls: Any, config: dict[str, Any], key: str, value: Any
) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**config, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


def test_siglip_model_refuses_towers_it_cannot_compare() -> None:
    no_head = {**FULL, "vision_config": {**VISION, "vision_use_head": False}}
    with pytest.raises(tm.CheckpointError, match="SiglipModel.*vision_config.vision_use_head"):
        SiglipModel.from_config(no_head, key=jax.random.key(0))
    other = {**FULL, "text_config": {**TEXT, "projection_size": 8}}
    with pytest.raises(tm.CheckpointError, match="SiglipModel.*text_config.projection_size"):
        SiglipModel.from_config(other, key=jax.random.key(0))


def test_nested_refusals_name_the_sub_config() -> None:
    bad = {**FULL, "vision_config": {**VISION, "hidden_act": "xielu"}}
    with pytest.raises(tm.CheckpointError, match=r"SiglipModel \(vision_config\).*hidden_act"):
        SiglipModel.from_config(bad, key=jax.random.key(0))


@pytest.mark.parametrize("size", [(24, 24), (8, 32), (20, 12)])
def test_interpolate_pos_encoding_equals_transformers(size: tuple[int, int]) -> None:
    """Other sizes with interpolate_pos_encoding=True: the positions resized with PyTorch's
    bicubic kernel in transformers, the same in treemod."""
    hf = _hf("SiglipVisionModel", VISION)
    model = _ours("SiglipVisionModel", hf)
    pixels = np.random.default_rng(8).standard_normal((2, 3, *size)).astype(np.float32)
    inputs = {"pixel_values": pixels, "interpolate_pos_encoding": True}
    with torch.inference_mode():
        want = hf(pixel_values=torch.from_numpy(pixels), interpolate_pos_encoding=True)
    got = _run(model, inputs)
    assert _relative_error(got, want.last_hidden_state) < 1e-5
    pooled = _run(model, inputs, "pooler_output")
    assert _relative_error(pooled, want.pooler_output) < 1e-5
    with pytest.raises(ValueError, match=r"pixel_values has shape \(2, 3, {}, {}\)".format(*size)):
        model(pixel_values=pixels)


def test_builds_in_bfloat16() -> None:
    model = SiglipModel.from_config(FULL, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, _inputs("SiglipModel", FULL, np.random.default_rng(0)))
    assert out.dtype == jnp.bfloat16 and out.shape == (2, 3)
