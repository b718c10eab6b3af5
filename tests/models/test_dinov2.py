"""DINOv2 (`Dinov2Model`, `Dinov2ForImageClassification`) against `transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in `eval()` mode;
weights move with `tm.load_state_dict` (the SwiGLU block's `gate_proj`/`up_proj` fused into the
files' `weights_in`) and through `save_pretrained` directories both ways. Float32 outputs agree
within 1e-5 relative (max abs error over max abs value).
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
from safetensors.numpy import load_file

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models.dinov2 import Dinov2ForImageClassification, Dinov2Model

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

CLASSES = {
    "Dinov2Model": (Dinov2Model, transformers.Dinov2Model),
    "Dinov2ForImageClassification": (
        Dinov2ForImageClassification,
        transformers.Dinov2ForImageClassification,
    ),
}
TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "mlp_ratio": 2,
    "image_size": 32,
    "patch_size": 8,
    "num_labels": 5,
    "layerscale_value": 0.5,
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})


def _relative_error(got: Any, ref: torch.Tensor) -> float:
    ref_np = ref.detach().numpy()
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = CLASSES[name][1](transformers.Dinov2Config(**config)).eval()
    with torch.no_grad():  # random layer scales and mask token, so that they matter
        for n, p in model.named_parameters():
            if "lambda1" in n or "mask_token" in n:
                p.copy_(torch.randn(p.shape))
    return model


def _state(hf_model: Any) -> dict[str, np.ndarray]:
    """`hf_model.state_dict()` with the SwiGLU halves fused as transformers' files hold them."""
    state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    for gate in [k for k in state if ".mlp.gate_proj." in k]:
        up, fused = gate.replace("gate_proj", "up_proj"), gate.replace("gate_proj", "weights_in")
        state[fused] = np.concatenate([state.pop(gate), state.pop(up)], axis=0)
    for down in [k for k in state if ".mlp.down_proj." in k]:
        state[down.replace("down_proj", "weights_out")] = state.pop(down)
    return state


def _ours(name: str, hf_model: Any) -> Any:
    config = json.loads(hf_model.config.to_json_string())
    cls = CLASSES[name][0]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, _state(hf_model))


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any]) -> jax.Array:
    return model(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray], field: str = "") -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    if field:
        return getattr(out, field)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _pixels(rng: np.random.Generator, batch: int, config: dict[str, Any]) -> np.ndarray:
    size = config["image_size"]
    shape = (batch, config.get("num_channels", 3), size, size)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers(name: str, swiglu: bool) -> None:
    config = {**TINY, "use_swiglu_ffn": swiglu}
    hf = _hf(name, config)
    model = _ours(name, hf)
    inputs = {"pixel_values": _pixels(np.random.default_rng(0), 2, config)}
    ref = _reference(hf, inputs)
    got = _run(model, inputs)
    assert got.shape == tuple(ref.shape)
    assert _relative_error(got, ref) < 1e-5


def test_pooler_output_mask_token_and_attention_mask() -> None:
    hf = _hf("Dinov2Model", TINY)
    model = _ours("Dinov2Model", hf)
    rng = np.random.default_rng(2)
    inputs = {"pixel_values": _pixels(rng, 2, TINY)}
    pooled = model.pooler_output(**inputs)
    assert _relative_error(pooled, _reference(hf, inputs, "pooler_output")) < 1e-5
    masked = {**inputs, "bool_masked_pos": rng.random((2, 16)) < 0.5}
    assert _relative_error(_run(model, masked), _reference(hf, masked)) < 1e-5
    mask = np.ones((2, 17), np.int64)
    mask[1, 9:] = 0
    with_mask = {**inputs, "attention_mask": mask}
    assert _relative_error(_run(model, with_mask), _reference(hf, with_mask)) < 1e-5


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    config = {
        "hidden_size": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "num_hidden_layers": data.draw(st.integers(1, 2), "layers"),
        "num_attention_heads": heads,
        "mlp_ratio": data.draw(st.sampled_from([1, 2, 3]), "mlp_ratio"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-6, 1e-2]), "eps"),
        "image_size": data.draw(st.sampled_from([16, 20, 32]), "image"),
        "patch_size": data.draw(st.sampled_from([4, 8, [8, 4]]), "patch"),
        "num_channels": data.draw(st.integers(1, 4), "channels"),
        "qkv_bias": data.draw(st.booleans(), "qkv_bias"),
        "use_swiglu_ffn": data.draw(st.booleans(), "swiglu"),
        "use_mask_token": data.draw(st.booleans(), "mask_token"),
        "num_labels": data.draw(st.integers(0, 4), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    inputs = {"pixel_values": _pixels(rng, data.draw(st.integers(1, 2), "batch"), config)}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, swiglu: bool, tmp_path: Any) -> None:
    """The files keep `attention.attention.query` and the fused `mlp.weights_in`; both ways."""
    config = {**TINY, "use_swiglu_ffn": swiglu}
    hf = _hf(name, config)
    hf.save_pretrained(tmp_path / "hf")
    files = set(load_file(str(tmp_path / "hf" / "model.safetensors")))
    assert any(".attention.attention.query." in k for k in files)
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = {"pixel_values": _pixels(np.random.default_rng(5), 2, config)}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    assert set(load_file(str(tmp_path / "ours" / "model.safetensors"))) == files
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs)) < 1e-5


# PEFT reads transformers' deprecated `is_gradient_checkpointing` (PEFT's use, not ours).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_adapter_from_treemod_loads_into_peft(tmp_path: Any) -> None:
    hf = _hf("Dinov2ForImageClassification", TINY)
    model = _ours("Dinov2ForImageClassification", hf)
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=4, alpha=8, key=jax.random.key(3))
    tuned = _randomise_b(tuned)
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    assert sum("lora_B" in n for n, _ in reference.named_parameters()) == 4
    inputs = {"pixel_values": _pixels(np.random.default_rng(6), 2, TINY)}
    want = _reference(reference, inputs)
    assert _relative_error(_run(tuned, inputs), want) < 1e-5
    assert _relative_error(_run(model, inputs), want) > 1e-3


def _randomise_b(model: Any) -> Any:
    """PEFT starts B at zero: random B, so that the adapters change the outputs."""
    keys = iter(jax.random.split(jax.random.key(4), 100))

    def one(layer: Any) -> Any:
        w = layer.lora_B.weight
        new = 0.3 * jax.random.normal(next(keys), w.shape, w.dtype)
        return tm.tree_at(lambda m: m.lora_B.weight, layer, new)

    with tm.shape_checks(False):  # a LoRA layer of a Stack holds stacked arrays
        return jax.tree.map(
            lambda x: one(x) if lora.is_lora_layer(x) else x, model, is_leaf=lora.is_lora_layer
        )


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (Dinov2Model, "hidden_act", "prelu"),
        (Dinov2Model, "image_size", [32, 16]),
        (Dinov2ForImageClassification, "patch_size", 0),
        (Dinov2Model, "patch_size", 64),
        (Dinov2Model, "mlp_ratio", 0),
        (Dinov2Model, "layerscale_value", "big"),
        (Dinov2Model, "use_swiglu_ffn", "yes"),
        (Dinov2Model, "use_mask_token", 1),
        (Dinov2Model, "drop_path_rate", 1.5),
        (Dinov2Model, "head_dim", 0),
        (Dinov2ForImageClassification, "num_labels", -1),
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


@pytest.mark.parametrize("size", [(48, 48), (16, 64), (40, 24), (35, 35)])
def test_other_image_sizes_resize_positions_as_transformers(size: tuple[int, int]) -> None:
    """Other sizes (and same-count non-square grids) resize the position embeddings with
    PyTorch's bicubic kernel in transformers; treemod's resize gives the same outputs."""
    hf = _hf("Dinov2ForImageClassification", TINY)
    model = _ours("Dinov2ForImageClassification", hf)
    pixels = np.random.default_rng(8).standard_normal((2, 3, *size)).astype(np.float32)
    inputs = {"pixel_values": pixels}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


def test_bicubic_weights_equal_torch_interpolate() -> None:
    from treemod.models._vit_interpolate import resize_grid

    table = np.random.default_rng(9).standard_normal((25, 3)).astype(np.float32)
    for size in [(3, 7), (5, 5), (2, 9), (12, 4), (1, 1)]:
        grid = torch.from_numpy(table.reshape(1, 5, 5, 3)).permute(0, 3, 1, 2)
        want = torch.nn.functional.interpolate(grid, size=size, mode="bicubic")
        want = want.permute(0, 2, 3, 1).reshape(-1, 3)
        assert _relative_error(resize_grid(jnp.asarray(table), size), want) < 1e-6


def test_builds_in_bfloat16() -> None:
    model = Dinov2ForImageClassification.from_config(
        TINY, key=jax.random.key(0), dtype=jnp.bfloat16
    )
    out = _run(model, {"pixel_values": _pixels(np.random.default_rng(0), 1, TINY)})
    assert out.dtype == jnp.bfloat16 and out.shape == (1, 5)
