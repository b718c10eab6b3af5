"""ConvNeXt (`ConvNextModel`, `ConvNextForImageClassification`) against `transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in `eval()` mode;
weights move with `tm.load_state_dict(model, hf_model.state_dict())` and through
`save_pretrained` directories both ways. Float32 outputs agree within 1e-5 relative (max abs
error over max abs value).
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

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models.convnext import ConvNextForImageClassification, ConvNextModel

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

CLASSES = {
    "ConvNextModel": (ConvNextModel, transformers.ConvNextModel),
    "ConvNextForImageClassification": (
        ConvNextForImageClassification,
        transformers.ConvNextForImageClassification,
    ),
}
TINY = {
    "hidden_sizes": [8, 16, 24],
    "depths": [1, 2, 1],
    "num_stages": 3,
    "num_labels": 5,
    "layer_scale_init_value": 0.5,
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu", "relu2"})


def _relative_error(got: Any, ref: torch.Tensor) -> float:
    ref_np = ref.detach().numpy()
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = CLASSES[name][1](transformers.ConvNextConfig(**config)).eval()
    with torch.no_grad():  # random norms and layer scales, so that they matter
        for n, p in model.named_parameters():
            if "layernorm" in n or "layer_scale" in n or "downsampling_layer.0" in n:
                p.copy_(1 + 0.3 * torch.randn(p.shape))
    return model


def _ours(name: str, hf_model: Any) -> Any:
    config = json.loads(hf_model.config.to_json_string())
    cls = CLASSES[name][0]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, hf_model.state_dict())


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any]) -> jax.Array:
    return model(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray], field: str = "") -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    if field:
        return getattr(out, field)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _pixels(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)
    inputs = {"pixel_values": _pixels(np.random.default_rng(0), (2, 3, 32, 40))}
    ref = _reference(hf, inputs)
    got = _run(model, inputs)
    assert got.shape == tuple(ref.shape)
    assert _relative_error(got, ref) < 1e-5


def test_pooler_output() -> None:
    hf = _hf("ConvNextModel", TINY)
    model = _ours("ConvNextModel", hf)
    inputs = {"pixel_values": _pixels(np.random.default_rng(1), (2, 3, 24, 24))}
    pooled = model.pooler_output(**inputs)
    assert _relative_error(pooled, _reference(hf, inputs, "pooler_output")) < 1e-5


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    stages = data.draw(st.integers(1, 3), "stages")
    config = {
        "num_channels": data.draw(st.integers(1, 4), "channels"),
        "patch_size": data.draw(st.sampled_from([2, 4, [4, 2]]), "patch"),
        "num_stages": stages,
        "hidden_sizes": data.draw(st.lists(st.integers(2, 12), min_size=stages, max_size=stages)),
        "depths": data.draw(st.lists(st.integers(1, 2), min_size=stages, max_size=stages)),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-6, 1e-2]), "eps"),
        "layer_scale_init_value": data.draw(st.sampled_from([0.0, 1e-6, 0.5, -1.0]), "scale"),
        "drop_path_rate": data.draw(st.sampled_from([0.0, 0.2]), "drop_path"),
        "num_labels": data.draw(st.integers(0, 4), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    size = data.draw(st.sampled_from([16, 20, 32]), "size")
    batch = data.draw(st.integers(1, 2), "batch")
    inputs = {"pixel_values": _pixels(rng, (batch, config["num_channels"], size, size))}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    hf = _hf(name, TINY)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = {"pixel_values": _pixels(np.random.default_rng(5), (1, 3, 32, 32))}
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs)) < 1e-5


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


# PEFT reads transformers' deprecated `is_gradient_checkpointing` (PEFT's use, not ours).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_adapter_from_treemod_loads_into_peft(tmp_path: Any) -> None:
    hf = _hf("ConvNextForImageClassification", TINY)
    model = _ours("ConvNextForImageClassification", hf)
    tuned = lora.add_lora(model, ["pwconv1", "pwconv2"], r=2, alpha=4, key=jax.random.key(3))
    tuned = _randomise_b(tuned)
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    assert sum("lora_B" in n for n, _ in reference.named_parameters()) == 8
    inputs = {"pixel_values": _pixels(np.random.default_rng(6), (2, 3, 32, 32))}
    want = _reference(reference, inputs)
    assert _relative_error(_run(tuned, inputs), want) < 1e-5
    assert _relative_error(_run(model, inputs), want) > 1e-3


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (ConvNextModel, "hidden_act", "prelu"),
        (ConvNextModel, "hidden_sizes", []),
        (ConvNextForImageClassification, "depths", [1, 0, 1]),
        (ConvNextModel, "num_stages", 2),
        (ConvNextModel, "patch_size", 0),
        (ConvNextModel, "layer_norm_eps", 0),
        (ConvNextModel, "layer_scale_init_value", "small"),
        (ConvNextModel, "drop_path_rate", 2.0),
        (ConvNextModel, "num_channels", 0),
        (ConvNextForImageClassification, "num_labels", -1),
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


def test_builds_in_bfloat16() -> None:
    config = {"hidden_sizes": [8], "depths": [1], "num_stages": 1, "num_labels": 5}
    model = ConvNextForImageClassification.from_config(
        config, key=jax.random.key(0), dtype=jnp.bfloat16
    )
    out = _run(model, {"pixel_values": _pixels(np.random.default_rng(0), (1, 3, 16, 16))})
    assert out.dtype == jnp.bfloat16 and out.shape == (1, 5)
