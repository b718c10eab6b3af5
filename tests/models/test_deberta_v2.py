"""DeBERTa-v2 (`DebertaV2Model` and its masked-LM, sequence and token classifiers) against
`transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in the test (weights
redrawn with std 0.5 so that rounding is not amplified by nearly constant activations), in
`eval()` mode. Float32 outputs agree within 1e-5 relative (max abs error over max abs value) on
the real tokens of padded batches. Hypothesis covers the config values the classes read; every
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
from treemod.models.deberta_v2 import (
    DebertaV2ForMaskedLM,
    DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification,
    DebertaV2Model,
)

CLASSES = {
    "DebertaV2Model": (DebertaV2Model, transformers.DebertaV2Model),
    "DebertaV2ForMaskedLM": (DebertaV2ForMaskedLM, transformers.DebertaV2ForMaskedLM),
    "DebertaV2ForSequenceClassification": (
        DebertaV2ForSequenceClassification,
        transformers.DebertaV2ForSequenceClassification,
    ),
    "DebertaV2ForTokenClassification": (
        DebertaV2ForTokenClassification,
        transformers.DebertaV2ForTokenClassification,
    ),
}
# DeBERTa-v3's shape: relative attention with both terms, log buckets, shared keys, normed
# relative embeddings, no absolute positions.
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_buckets": 8,
    "max_relative_positions": 64,
    "share_att_key": True,
    "norm_rel_ebd": "layer_norm",
    "position_biased_input": False,
    "type_vocab_size": 2,
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
    if keep is not None and got_np.shape[:2] == keep.shape:  # per token: real tokens only
        got_np, ref_np = got_np[keep.astype(bool)], ref_np[keep.astype(bool)]
    return float(np.abs(got_np - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    model = CLASSES[name][1](transformers.DebertaV2Config(**config)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def _ours(name: str, hf_model: Any) -> Any:
    """The treemod twin of `hf_model`, built from its config.json and loaded from its tensors."""
    cls = CLASSES[name][0]
    config = json.loads(hf_model.config.to_json_string())
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    tensors = dict(hf_model.state_dict())
    for alias, source in model.tied_weights().items():
        assert torch.equal(tensors[alias], tensors[source])
        del tensors[alias]
    return tm.load_state_dict(model, tensors)


@tm.filter_jit
def _run(model: Any, inputs: dict[str, Any]) -> jax.Array:
    return model(**inputs)


def _reference(hf_model: Any, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    with torch.inference_mode():
        out = hf_model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _inputs(rng: np.random.Generator, batch: int, seq: int, config: dict[str, Any]) -> dict:
    """Ids, token types and a mask padded on the right (DeBERTa's tokenizer side) of at least
    one real token."""
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        mask[b, rng.integers(1, seq + 1) :] = 0
    inputs = {
        "input_ids": rng.integers(0, config["vocab_size"], (batch, seq)),
        "attention_mask": mask,
    }
    if config.get("type_vocab_size", 0):
        inputs["token_type_ids"] = rng.integers(0, config["type_vocab_size"], (batch, seq))
    return inputs


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers_on_padded_batches(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)
    inputs = _inputs(np.random.default_rng(0), 3, 11, TINY)
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


def test_left_padding_equals_transformers_on_the_real_tokens() -> None:
    hf = _hf("DebertaV2Model", TINY)
    model = _ours("DebertaV2Model", hf)
    inputs = _inputs(np.random.default_rng(1), 3, 9, TINY)
    inputs["attention_mask"] = inputs["attention_mask"][:, ::-1].copy()
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_state_dict_names_are_transformers_names(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)  # strict: every file name and no other
    assert set(tm.state_dict(model)) | set(model.tied_weights()) == set(hf.state_dict())


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    hf = _hf(name, TINY)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = _inputs(np.random.default_rng(6), 2, 7, TINY)
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    for k, v in hf.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs), keep) < 1e-5


def test_old_files_buffers_are_skipped_as_transformers_skips_them(tmp_path: Any) -> None:
    """Without absolute positions transformers skips a file's `position_embeddings`, and the
    masked-LM class its `mask_predictions.*` (each class's `_keys_to_ignore_on_load_unexpected`)."""
    from safetensors.numpy import load_file, save_file

    for name, extra in (
        ("DebertaV2ForTokenClassification", "deberta.embeddings.position_embeddings.weight"),
        ("DebertaV2ForMaskedLM", "mask_predictions.dense.weight"),
    ):
        hf = _hf(name, TINY)
        hf.save_pretrained(tmp_path / name)
        weights = tmp_path / name / "model.safetensors"
        tensors = load_file(weights)
        tensors[extra] = np.ones((4, TINY["hidden_size"]), np.float32)
        save_file(tensors, weights, metadata={"format": "pt"})
        _, info = CLASSES[name][1].from_pretrained(tmp_path / name, output_loading_info=True)
        assert info["unexpected_keys"] == set() or info["unexpected_keys"] == []
        model = from_pretrained(tmp_path / name)
        inputs = _inputs(np.random.default_rng(3), 2, 5, TINY)
        keep = inputs["attention_mask"]
        assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


def test_untied_legacy_and_new_masked_lm_heads() -> None:
    for extra in ({"tie_word_embeddings": False}, {"legacy": False}):
        config = {**TINY, **extra}
        hf = _hf("DebertaV2ForMaskedLM", config)
        model = _ours("DebertaV2ForMaskedLM", hf)
        assert model.tied_weights() == {}
        inputs = _inputs(np.random.default_rng(1), 2, 7, config)
        keep = inputs["attention_mask"]
        assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


def test_position_ids_and_inputs_embeds() -> None:
    config = {**TINY, "position_biased_input": True, "embedding_size": 24}
    hf = _hf("DebertaV2Model", config)
    model = _ours("DebertaV2Model", hf)
    rng = np.random.default_rng(2)
    inputs = _inputs(rng, 2, 6, config)
    inputs["position_ids"] = rng.integers(0, config["max_position_embeddings"], (2, 6))
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5
    embeds = rng.standard_normal((2, 6, 24)).astype(np.float32)
    by_embeds = {"inputs_embeds": embeds, "attention_mask": keep}
    assert _relative_error(_run(model, by_embeds), _reference(hf, by_embeds), keep) < 1e-5


@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    hidden = heads * data.draw(st.sampled_from([4, 8]), "head_dim")
    kernel = data.draw(st.sampled_from([0, 0, 1, 3]), "conv kernel")
    config: dict[str, Any] = {
        "vocab_size": data.draw(st.integers(8, 40), "vocab"),
        "hidden_size": hidden,
        "num_hidden_layers": data.draw(st.integers(1, 3), "layers"),
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 40), "intermediate"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "pooler_hidden_act": data.draw(st.sampled_from(ACTS), "pooler act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-7, 1e-5, 1e-2]), "eps"),
        "max_position_embeddings": data.draw(st.integers(12, 40), "positions"),
        "type_vocab_size": data.draw(st.integers(0, 3), "types"),
        "relative_attention": data.draw(st.booleans(), "relative"),
        "pos_att_type": data.draw(
            st.sampled_from([None, ["c2p"], ["p2c"], ["p2c", "c2p"], "c2p|p2c"]), "pos_att_type"
        ),
        "position_buckets": data.draw(st.sampled_from([-1, 4, 6, 16]), "buckets"),
        "max_relative_positions": data.draw(st.sampled_from([-1, 8, 30]), "max relative"),
        "share_att_key": data.draw(st.booleans(), "share"),
        "norm_rel_ebd": data.draw(st.sampled_from(["none", "layer_norm"]), "norm_rel_ebd"),
        "position_biased_input": data.draw(st.booleans(), "absolute positions"),
        "conv_kernel_size": kernel,
        "conv_groups": data.draw(st.sampled_from([1, heads]), "conv groups"),
        "conv_act": data.draw(st.sampled_from(["tanh", "gelu"]), "conv act"),
        "embedding_size": data.draw(st.sampled_from([None, hidden, 12]), "embedding size"),
        "pad_token_id": data.draw(st.sampled_from([0, None, 5]), "pad"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "legacy": True,
        "cls_dropout": data.draw(st.sampled_from([None, 0.3]), "cls_dropout"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
    }
    if config["embedding_size"] is None:  # absent: transformers reads getattr's default
        del config["embedding_size"]
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    inputs = _inputs(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12)), config)
    if data.draw(st.booleans(), "drop mask"):
        del inputs["attention_mask"]
    keep = inputs.get("attention_mask")
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (DebertaV2Model, "hidden_act", "prelu"),
        (DebertaV2ForSequenceClassification, "pooler_hidden_act", "no_such_activation"),
        (DebertaV2Model, "conv_act", "prelu"),
        (DebertaV2Model, "num_attention_heads", 3),
        (DebertaV2Model, "attention_head_size", 4),
        (DebertaV2ForSequenceClassification, "pooler_hidden_size", 16),
        (DebertaV2Model, "pos_att_type", ["p2p"]),
        (DebertaV2Model, "pos_att_type", "c2p|p2p"),
        (DebertaV2Model, "norm_rel_ebd", "batch_norm"),
        (DebertaV2Model, "conv_kernel_size", 4),
        (DebertaV2Model, "position_buckets", 1),
        (DebertaV2Model, "max_relative_positions", 1.5),
        (DebertaV2ForMaskedLM, "embedding_size", 16),  # with legacy false
        (DebertaV2Model, "layer_norm_eps", 0.0),
        (DebertaV2Model, "pad_token_id", 50),
        (DebertaV2ForTokenClassification, "num_labels", 5),  # id2label holds 2
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    config = {**TINY, key: value}
    if key == "num_labels":
        config["id2label"] = {"0": "a", "1": "b"}
    if key == "embedding_size":
        config["legacy"] = False
    if key == "conv_kernel_size":
        config["conv_kernel_size"] = value
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config(config, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message


def test_lora_on_query_and_value_proj_equals_peft(tmp_path: Any) -> None:
    # A classifier would make PEFT look for its head in the adapter (modules_to_save).
    hf = _hf("DebertaV2ForMaskedLM", TINY)
    model = _ours("DebertaV2ForMaskedLM", hf)
    tuned = lora.add_lora(model, ["query_proj", "value_proj"], r=4, alpha=8, key=jax.random.key(3))
    attention = tuned.deberta.encoder.layer.layers.attention.self
    b_shape = attention.query_proj.lora_B.weight.shape  # (layers, hidden, r)
    tuned = tm.tree_at(
        lambda m: (
            m.deberta.encoder.layer.layers.attention.self.query_proj.lora_B.weight,
            m.deberta.encoder.layer.layers.attention.self.value_proj.lora_B.weight,
        ),
        tuned,
        (
            jax.random.normal(jax.random.key(1), b_shape),
            jax.random.normal(jax.random.key(2), b_shape),
        ),
    )
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    inputs = _inputs(np.random.default_rng(5), 2, 6, TINY)
    want = _reference(reference, inputs)
    keep = inputs["attention_mask"]
    assert _relative_error(_run(tuned, inputs), want, keep) < 1e-5
    assert _relative_error(_run(model, inputs), want, keep) > 1e-3


def test_builds_under_filter_eval_shape_and_in_bfloat16() -> None:
    shapes = tm.filter_eval_shape(
        lambda: DebertaV2ForMaskedLM.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    )
    assert shapes.deberta.encoder.rel_embeddings.weight.shape == (16, 32)
    model = DebertaV2Model.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, {"input_ids": np.array([[1, 2, 3]])})
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())


def test_dropout_runs_only_in_training_mode() -> None:
    config = {**TINY, "hidden_dropout_prob": 0.5, "attention_probs_dropout_prob": 0.5}
    model = DebertaV2Model.from_config(config, key=jax.random.key(0))
    inputs = {"input_ids": np.array([[1, 2, 3, 4]])}
    evaluation = _run(model, inputs)
    assert bool(jnp.array_equal(evaluation, _run(model, {**inputs, "key": jax.random.key(1)})))
    training = tm.nn.inference_mode(model, False)
    a = _run(training, {**inputs, "key": jax.random.key(1)})
    b = _run(training, {**inputs, "key": jax.random.key(2)})
    assert not bool(jnp.allclose(a, evaluation)) and not bool(jnp.allclose(a, b))
