"""BERT (`BertModel` and its masked-LM, sequence and token classifiers) against `transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in the test, in
`eval()` mode; weights move with `tm.load_state_dict(model, hf_model.state_dict())` and back
with `tm.state_dict`. Float32 outputs agree within 1e-5 relative (max abs error over max abs
value). Hypothesis covers the config values the classes read; every refused value raises a
`CheckpointError` naming the class and the config key.
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
from bert_family_checks import check_lora, check_position_ids_skipped
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
from treemod.models import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    from_pretrained,
    save_pretrained,
)
from treemod.models.bert import BertForTokenClassification

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

CLASSES = {
    "BertModel": (BertModel, transformers.BertModel),
    "BertForMaskedLM": (BertForMaskedLM, transformers.BertForMaskedLM),
    "BertForSequenceClassification": (
        BertForSequenceClassification,
        transformers.BertForSequenceClassification,
    ),
    "BertForTokenClassification": (
        BertForTokenClassification,
        transformers.BertForTokenClassification,
    ),
}
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 16,
}
# Every parameter-free activation of transformers' ACT2FN.
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})


def _relative_error(got: Any, ref: torch.Tensor) -> float:
    ref_np = ref.detach().numpy()
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def _hf(name: str, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return CLASSES[name][1](transformers.BertConfig(**config)).eval()


def _ours(name: str, hf_model: Any) -> Any:
    """The treemod twin of `hf_model`, built from its config.json and loaded from its tensors."""
    cls = CLASSES[name][0]
    config = json.loads(hf_model.config.to_json_string())
    # A shape-only skeleton, filled by load_state_dict: no random initialiser to compile
    # per new shape (seconds per hypothesis example).
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    tensors = dict(hf_model.state_dict())
    for alias, source in model.tied_weights().items():
        # transformers holds one tensor under both names; the alias must be that tensor.
        assert tensors[alias] is tensors[source] or torch.equal(tensors[alias], tensors[source])
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
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        mask[b, rng.integers(1, seq + 1) :] = 0  # padding at the end, at least one token
    return {
        "input_ids": rng.integers(0, config["vocab_size"], (batch, seq)),
        "attention_mask": mask,
        "token_type_ids": rng.integers(0, config.get("type_vocab_size", 2), (batch, seq)),
    }


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers_with_padding_and_token_types(name: str) -> None:
    hf = _hf(name, TINY)
    model = _ours(name, hf)
    inputs = _inputs(np.random.default_rng(0), 3, 9, TINY)
    ref = _reference(hf, inputs)
    got = _run(model, inputs)
    assert got.shape == tuple(ref.shape)
    assert _relative_error(got, ref) < 1e-5


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_state_dict_names_are_transformers_names(name: str) -> None:
    hf = _hf(name, TINY)
    model = CLASSES[name][0].from_config(TINY, key=jax.random.key(0))
    ours = set(tm.state_dict(model)) | set(model.tied_weights())
    assert ours == set(hf.state_dict())
    # The pooler: BertModel and the sequence classifier have it, the other heads none.
    assert ("bert.pooler.dense.weight" in ours or "pooler.dense.weight" in ours) == (
        name in ("BertModel", "BertForSequenceClassification")
    )


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_treemod_to_transformers(tie: bool) -> None:
    """A treemod model's own random weights, exported, give transformers the same logits."""
    config = {**TINY, "tie_word_embeddings": tie}
    model = BertForMaskedLM.from_config(config, key=jax.random.key(3))
    model = tm.tree_at(  # a non-zero head bias, so that the tied bias is checked too
        lambda m: m.cls.predictions.bias, model, jnp.linspace(-1, 1, TINY["vocab_size"])
    )
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in tm.state_dict(model).items()}
    for alias, source in model.tied_weights().items():
        tensors[alias] = tensors[source]
    hf = _hf("BertForMaskedLM", config)
    hf.load_state_dict(tensors, strict=True)
    inputs = _inputs(np.random.default_rng(1), 2, 7, config)
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    assert (model.cls.predictions.decoder is None) == tie


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_save_pretrained_directories_both_ways(name: str, tmp_path: Any) -> None:
    hf = _hf(name, TINY)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is CLASSES[name][0]
    inputs = _inputs(np.random.default_rng(6), 2, 5, TINY)
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs)) < 1e-5


def test_position_ids_and_inputs_embeds() -> None:
    hf = _hf("BertModel", TINY)
    model = _ours("BertModel", hf)
    rng = np.random.default_rng(2)
    inputs = _inputs(rng, 2, 6, TINY)
    inputs["position_ids"] = rng.integers(0, TINY["max_position_embeddings"], (2, 6))
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5
    embeds = rng.standard_normal((2, 6, TINY["hidden_size"])).astype(np.float32)
    by_embeds = {"inputs_embeds": embeds, "attention_mask": inputs["attention_mask"]}
    assert _relative_error(_run(model, by_embeds), _reference(hf, by_embeds)) < 1e-5


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    config = {
        "vocab_size": data.draw(st.integers(8, 40), "vocab"),
        "hidden_size": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "num_hidden_layers": data.draw(st.integers(1, 2), "layers"),
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 40), "intermediate"),
        "hidden_act": data.draw(st.sampled_from(ACTS), "act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-5, 1e-2]), "eps"),
        "max_position_embeddings": data.draw(st.integers(12, 20), "positions"),
        "type_vocab_size": data.draw(st.integers(1, 3), "types"),
        "pad_token_id": data.draw(st.sampled_from([0, None, 5]), "pad"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "classifier_dropout": data.draw(st.sampled_from([None, 0.3]), "classifier_dropout"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
    }
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config)
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    inputs = _inputs(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12)), config)
    if data.draw(st.booleans(), "drop mask"):
        del inputs["attention_mask"]
    if data.draw(st.booleans(), "drop token types"):
        del inputs["token_type_ids"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs)) < 1e-5


def test_id2label_sets_the_number_of_labels() -> None:
    config = {**TINY, "id2label": {"0": "a", "1": "b", "2": "c"}}
    model = BertForSequenceClassification.from_config(config, key=jax.random.key(0))
    assert model.classifier.weight.shape == (3, TINY["hidden_size"])
    default = BertForSequenceClassification.from_config(TINY, key=jax.random.key(0))
    assert default.classifier.weight.shape[0] == transformers.BertConfig().num_labels == 2


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (BertModel, "is_decoder", True),
        (BertForMaskedLM, "add_cross_attention", True),
        (BertModel, "position_embedding_type", "relative_key"),
        (BertForMaskedLM, "position_embedding_type", "relative_key_query"),
        (BertModel, "hidden_act", "prelu"),
        (BertForSequenceClassification, "hidden_act", "no_such_activation"),
        (BertModel, "num_attention_heads", 3),
        (BertModel, "layer_norm_eps", 0.0),
        (BertModel, "hidden_dropout_prob", 1.5),
        (BertModel, "vocab_size", 0),
        (BertModel, "pad_token_id", 50),
        (BertForSequenceClassification, "classifier_dropout", -0.1),
        (BertForSequenceClassification, "num_labels", 5),  # id2label holds 2
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    config = {**TINY, key: value}
    if key == "num_labels":
        config["id2label"] = {"0": "a", "1": "b"}
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config(config, key=jax.random.key(0))
    message = str(info.value)
    assert cls.__name__ in message and key in message and repr(value) in message


def test_builds_under_filter_eval_shape_and_in_bfloat16() -> None:
    shapes = tm.filter_eval_shape(
        lambda: BertForMaskedLM.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    )
    word = shapes.bert.embeddings.word_embeddings.weight
    assert word.shape == (TINY["vocab_size"], TINY["hidden_size"]) and word.dtype == jnp.bfloat16
    model = BertModel.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, {"input_ids": np.array([[1, 2, 3]])})
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())


def test_dropout_runs_only_in_training_mode() -> None:
    config = {**TINY, "hidden_dropout_prob": 0.5, "attention_probs_dropout_prob": 0.5}
    model = BertModel.from_config(config, key=jax.random.key(0))
    inputs = {"input_ids": np.array([[1, 2, 3, 4]])}
    evaluation = _run(model, inputs)
    assert bool(jnp.array_equal(evaluation, _run(model, {**inputs, "key": jax.random.key(1)})))
    training = tm.nn.inference_mode(model, False)
    a = _run(training, {**inputs, "key": jax.random.key(1)})
    b = _run(training, {**inputs, "key": jax.random.key(2)})
    assert not bool(jnp.allclose(a, evaluation)) and not bool(jnp.allclose(a, b))


def test_bad_inputs_are_named() -> None:
    model = BertModel.from_config(TINY, key=jax.random.key(0))
    with pytest.raises(ValueError, match="BertModel: give exactly one of input_ids"):
        model(attention_mask=np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"BertModel: token_type_ids has shape \(1, 2\)"):
        model(input_ids=np.array([[1, 2, 3]]), token_type_ids=np.array([[0, 1]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(3,\)"):
        model(input_ids=np.array([[1, 2, 3]]), attention_mask=np.ones(3))


def test_old_position_ids_buffer_is_skipped(tmp_path: Any) -> None:
    hf = _hf("BertForMaskedLM", TINY)
    check_position_ids_skipped(BertForMaskedLM, transformers.BertForMaskedLM, hf, tmp_path)


# PEFT 0.21 reads transformers' deprecated property; the warning is theirs, not treemod's.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_with_peft_names(tmp_path: Any) -> None:
    hf = _hf("BertForTokenClassification", TINY)
    model = _ours("BertForTokenClassification", hf)
    inputs = _inputs(np.random.default_rng(4), 2, 6, TINY)
    check_lora(model, hf, ["query", "value"], inputs, tmp_path)
