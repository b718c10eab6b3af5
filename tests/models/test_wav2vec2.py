"""wav2vec2 (`Wav2Vec2Model`, `Wav2Vec2ForCTC`, `Wav2Vec2ForSequenceClassification`) against
`transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in the test (weights
redrawn with std 0.3 so that rounding is not amplified by nearly constant activations), in
`eval()` mode. Float32 outputs agree within 1e-5 relative (max abs error over max abs value) on
the real frames of padded batches. Hypothesis covers the config values the classes read; every
refused value raises a `CheckpointError` naming the class and the config key.
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
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models.wav2vec2 import (
    Wav2Vec2ForCTC,
    Wav2Vec2ForSequenceClassification,
    Wav2Vec2Model,
)

CLASSES = {
    "Wav2Vec2Model": (Wav2Vec2Model, transformers.Wav2Vec2Model),
    "Wav2Vec2ForCTC": (Wav2Vec2ForCTC, transformers.Wav2Vec2ForCTC),
    "Wav2Vec2ForSequenceClassification": (
        Wav2Vec2ForSequenceClassification,
        transformers.Wav2Vec2ForSequenceClassification,
    ),
}
TINY = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 24,
    "conv_dim": [8, 12],
    "conv_stride": [4, 2],
    "conv_kernel": [8, 3],
    "num_conv_pos_embeddings": 6,
    "num_conv_pos_embedding_groups": 2,
    "vocab_size": 20,
    "classifier_proj_size": 8,
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})
# peft 0.21 reads a property that transformers 5 deprecates; neither is ours.
# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]


def _relative_error(got: Any, ref: Any, keep: np.ndarray | None = None) -> float:
    ref_np = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    got_np = np.asarray(got)
    assert got_np.shape == ref_np.shape, (got_np.shape, ref_np.shape)
    if keep is not None and got_np.shape[:2] == keep.shape:  # per frame: real frames only
        got_np, ref_np = got_np[keep], ref_np[keep]
    return float(np.abs(got_np - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = CLASSES[name][1](transformers.Wav2Vec2Config(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _ours(name: str, hf_model: Any) -> Any:
    """The treemod twin of `hf_model`, built from its config.json and loaded from its tensors."""
    cls = CLASSES[name][0]
    config = json.loads(hf_model.config.to_json_string())
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    return tm.load_state_dict(model, dict(hf_model.state_dict()))


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any]) -> jax.Array:
    return model(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _inputs(rng: np.random.Generator, batch: int, samples: int) -> dict[str, np.ndarray]:
    """Audio padded on the right (zeros, as the feature extractor pads) of at least 60 samples."""
    mask = np.ones((batch, samples), np.int64)
    for b in range(1, batch):
        mask[b, rng.integers(60, samples + 1) :] = 0
    audio = rng.standard_normal((batch, samples)).astype(np.float32) * mask
    return {"input_values": audio.astype(np.float32), "attention_mask": mask}


def _frames(model: Any, inputs: dict[str, np.ndarray], frames: int) -> np.ndarray | None:
    base = model if isinstance(model, Wav2Vec2Model) else model.wav2vec2
    mask = base.frames_mask(inputs.get("attention_mask"), frames)
    return None if mask is None else np.asarray(mask)


def _check(model: Any, hf: Any, inputs: dict[str, np.ndarray]) -> None:
    got = _run(model, inputs)
    keep = _frames(model, inputs, got.shape[1]) if got.ndim == 3 else None
    assert _relative_error(got, _reference(hf, inputs), keep) < 1e-5


@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("norm", ["group", "layer"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers_on_padded_batches(name: str, norm: str, stable: bool) -> None:
    config = {**TINY, "feat_extract_norm": norm, "do_stable_layer_norm": stable}
    hf = _hf(name, config)
    model = _ours(name, hf)
    _check(model, hf, _inputs(np.random.default_rng(0), 3, 240))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_state_dict_names_are_transformers_names(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)  # strict: every file name and no other
    assert set(tm.state_dict(model)) == set(hf.state_dict())


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    hf = _hf(name, TINY)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = _inputs(np.random.default_rng(6), 2, 200)
    _check(model, hf, inputs)
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    for k, v in hf.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    _check(model, again.eval(), inputs)


def test_older_files_weight_g_and_weight_v_load(tmp_path: Any) -> None:
    """Files written before PyTorch's parametrizations name the positional convolution's weight
    norm `weight_g` / `weight_v`; both libraries read them as the new names."""
    from safetensors.numpy import load_file, save_file

    hf = _hf("Wav2Vec2ForCTC", TINY)
    hf.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    old = {
        k.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): v
        for k, v in load_file(weights).items()
    }
    assert "wav2vec2.encoder.pos_conv_embed.conv.weight_g" in old
    save_file(old, weights, metadata={"format": "pt"})
    reference, info = transformers.Wav2Vec2ForCTC.from_pretrained(
        tmp_path, output_loading_info=True
    )
    assert not (info["missing_keys"] or info["unexpected_keys"])
    model = from_pretrained(tmp_path)
    _check(model, reference.eval(), _inputs(np.random.default_rng(2), 2, 180))


@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    hidden = heads * data.draw(st.sampled_from([4, 8]), "head_dim")
    convs = data.draw(st.integers(1, 3), "conv layers")
    config: dict[str, Any] = {
        "hidden_size": hidden,
        "num_hidden_layers": data.draw(st.integers(1, 2), "layers"),
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 32), "intermediate"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "feat_extract_activation": data.draw(st.sampled_from(["gelu", "relu", "tanh"]), "conv act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-5, 1e-2]), "eps"),
        "feat_extract_norm": data.draw(st.sampled_from(["group", "layer"]), "norm"),
        "do_stable_layer_norm": data.draw(st.booleans(), "stable"),
        "conv_dim": [data.draw(st.integers(2, 10)) for _ in range(convs)],
        "conv_stride": [data.draw(st.integers(1, 3)) for _ in range(convs)],
        "conv_kernel": [data.draw(st.integers(1, 5)) for _ in range(convs)],
        "conv_bias": data.draw(st.booleans(), "conv bias"),
        "num_conv_pos_embeddings": data.draw(st.integers(1, 7), "pos kernel"),
        "num_conv_pos_embedding_groups": data.draw(st.sampled_from([1, heads]), "pos groups"),
        "mask_time_prob": data.draw(st.sampled_from([0.0, 0.05]), "mask_time_prob"),
        "vocab_size": data.draw(st.integers(2, 12), "vocab"),
        "classifier_proj_size": data.draw(st.integers(1, 8), "proj"),
        "num_labels": data.draw(st.integers(1, 3), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    inputs = _inputs(rng, data.draw(st.integers(1, 3), "batch"), data.draw(st.integers(80, 160)))
    if data.draw(st.booleans(), "drop mask"):
        del inputs["attention_mask"]
    _check(model, hf, inputs)


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (Wav2Vec2Model, "hidden_act", "prelu"),
        (Wav2Vec2Model, "feat_extract_activation", "no_such_activation"),
        (Wav2Vec2Model, "feat_extract_norm", "batch"),
        (Wav2Vec2Model, "num_attention_heads", 3),
        (Wav2Vec2Model, "num_conv_pos_embedding_groups", 3),
        (Wav2Vec2Model, "conv_stride", [4]),
        (Wav2Vec2Model, "conv_kernel", [8, 0]),
        (Wav2Vec2ForCTC, "add_adapter", True),
        (Wav2Vec2ForCTC, "adapter_attn_dim", 16),
        (Wav2Vec2ForCTC, "vocab_size", None),
        (Wav2Vec2ForSequenceClassification, "use_weighted_layer_sum", True),
        (Wav2Vec2Model, "layer_norm_eps", 0.0),
        (Wav2Vec2ForSequenceClassification, "num_labels", 5),  # id2label holds 2
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    config = {**TINY, key: value}
    if key == "num_labels":
        config["id2label"] = {"0": "a", "1": "b"}
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config(config, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


def test_lora_on_q_and_v_proj_equals_peft(tmp_path: Any) -> None:
    hf = _hf("Wav2Vec2ForCTC", TINY)
    model = _ours("Wav2Vec2ForCTC", hf)
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=4, alpha=8, key=jax.random.key(3))
    b_shape = tuned.wav2vec2.encoder.layers.layers.attention.q_proj.lora_B.weight.shape
    tuned = tm.tree_at(
        lambda m: (
            m.wav2vec2.encoder.layers.layers.attention.q_proj.lora_B.weight,
            m.wav2vec2.encoder.layers.layers.attention.v_proj.lora_B.weight,
        ),
        tuned,
        (
            jax.random.normal(jax.random.key(1), b_shape),
            jax.random.normal(jax.random.key(2), b_shape),
        ),
    )
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    inputs = _inputs(np.random.default_rng(5), 2, 160)
    _check(tuned, reference, inputs)
    got, want = _run(model, inputs), _reference(reference, inputs)
    assert _relative_error(got, want, _frames(model, inputs, got.shape[1])) > 1e-3


def test_builds_under_filter_eval_shape_and_in_bfloat16() -> None:
    shapes = tm.filter_eval_shape(
        lambda: Wav2Vec2ForCTC.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    )
    assert shapes.lm_head.weight.shape == (20, 16) and shapes.lm_head.weight.dtype == jnp.bfloat16
    model = Wav2Vec2Model.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, {"input_values": jnp.ones((1, 100), jnp.bfloat16)})
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())


def test_dropout_runs_only_in_training_mode() -> None:
    model = Wav2Vec2Model.from_config({**TINY, "hidden_dropout": 0.5}, key=jax.random.key(0))
    inputs = {"input_values": np.ones((1, 100), np.float32)}
    evaluation = _run(model, inputs)
    assert bool(jnp.array_equal(evaluation, _run(model, {**inputs, "key": jax.random.key(1)})))
    training = tm.nn.inference_mode(model, False)
    a = _run(training, {**inputs, "key": jax.random.key(1)})
    b = _run(training, {**inputs, "key": jax.random.key(2)})
    assert not bool(jnp.allclose(a, evaluation)) and not bool(jnp.allclose(a, b))
