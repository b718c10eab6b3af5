"""DistilBERT against `transformers` (see `bert_family_checks.py`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import transformers
from bert_family_checks import (
    RTOL,
    check_dropout,
    check_lora,
    check_padding,
    check_position_ids_skipped,
    check_round_trip,
    hf_model,
    padded,
    reference,
    relative_error,
    run,
    twin,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import treemod as tm
from treemod.models import distilbert

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
TINY = {
    "vocab_size": 50,
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "hidden_dim": 37,
    "max_position_embeddings": 20,
    "num_labels": 3,
}


def classes(head: str) -> tuple[Any, Any]:
    name = "DistilBert" + head
    return getattr(distilbert, name), getattr(transformers, name)


def pair(head: str, config: dict[str, Any] = TINY) -> tuple[Any, Any]:
    ours, hf_cls = classes(head)
    hf = hf_model(hf_cls, transformers.DistilBertConfig, config)
    return hf, twin(ours, hf)


@pytest.mark.parametrize("head", HEADS)
def test_left_and_right_padding_equal_transformers(head: str) -> None:
    hf, model = pair(head)
    check_padding(model, hf, TINY, pad=0)


@pytest.mark.parametrize("head", HEADS)
def test_save_pretrained_round_trips(head: str, tmp_path: Any) -> None:
    ours, hf_cls = classes(head)
    hf, _ = pair(head)
    inputs = padded(np.random.default_rng(1), 2, 6, TINY["vocab_size"], 0, "left")
    check_round_trip(ours, hf_cls, hf, tmp_path, inputs)


def test_position_ids_and_inputs_embeds() -> None:
    hf, model = pair("Model")
    rng = np.random.default_rng(2)
    embeds = rng.standard_normal((2, 5, TINY["dim"])).astype(np.float32)
    ids = rng.integers(1, TINY["vocab_size"], (2, 5))
    for inputs in (
        {"inputs_embeds": embeds},
        {"input_ids": ids, "position_ids": rng.integers(0, 20, (2, 5))},
    ):
        assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL


def test_sinusoidal_positions_initialise_as_transformers() -> None:
    config = {**TINY, "sinusoidal_pos_embds": True, "dim": 12, "n_heads": 2}
    hf = hf_model(transformers.DistilBertModel, transformers.DistilBertConfig, config)
    model = distilbert.DistilBertModel.from_config(config, key=jax.random.key(0))
    ours = np.asarray(model.embeddings.position_embeddings.weight)
    np.testing.assert_array_equal(ours, hf.embeddings.position_embeddings.weight.detach().numpy())


@pytest.mark.parametrize("tie", [True, False])
def test_masked_lm_ties_only_the_projector_weight(tie: bool, tmp_path: Any) -> None:
    config = {**TINY, "tie_word_embeddings": tie}
    model = distilbert.DistilBertForMaskedLM.from_config(config, key=jax.random.key(2))
    bias = jax.numpy.linspace(-1, 1, TINY["vocab_size"])
    model = tm.tree_at(lambda m: m.vocab_projector.bias, model, bias)
    tm.models.save_pretrained(model, tmp_path)
    hf = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path).eval()
    tied = hf.vocab_projector.weight is hf.distilbert.embeddings.word_embeddings.weight
    assert tied == tie
    np.testing.assert_array_equal(hf.vocab_projector.bias.detach().numpy(), np.asarray(bias))
    inputs = padded(np.random.default_rng(5), 2, 6, TINY["vocab_size"], 0, "right")
    assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL


def test_old_position_ids_buffer_is_skipped(tmp_path: Any) -> None:
    hf, _ = pair("ForMaskedLM")
    ours, hf_cls = classes("ForMaskedLM")
    check_position_ids_skipped(ours, hf_cls, hf, tmp_path)


# PEFT 0.21 reads transformers' deprecated property; the warning is theirs, not treemod's.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_with_peft_names(tmp_path: Any) -> None:
    hf, model = pair("ForSequenceClassification")
    inputs = padded(np.random.default_rng(7), 2, 6, TINY["vocab_size"], 0, "left")
    check_lora(model, hf, ["q_lin", "v_lin", "lin1"], inputs, tmp_path)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    config = {
        "vocab_size": data.draw(st.integers(8, 40), "vocab"),
        "dim": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "n_layers": data.draw(st.integers(1, 2), "layers"),
        "n_heads": heads,
        "hidden_dim": data.draw(st.integers(4, 40), "hidden_dim"),
        "activation": data.draw(st.sampled_from(["gelu", "relu", "gelu_new", "silu"]), "act"),
        "max_position_embeddings": data.draw(st.integers(12, 20), "positions"),
        "sinusoidal_pos_embds": data.draw(st.booleans(), "sinusoidal"),
        "pad_token_id": data.draw(st.sampled_from([0, None, 5]), "pad"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
    }
    head = data.draw(st.sampled_from(HEADS), "head")
    hf, model = pair(head, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    side = data.draw(st.sampled_from(["left", "right"]), "side")
    inputs = padded(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 10)),
                    config["vocab_size"], config["pad_token_id"], side)  # fmt: skip
    ref, got = reference(hf, inputs), run(model, inputs)
    keep = inputs["attention_mask"].astype(bool)
    if got.ndim == 3:
        assert relative_error(np.asarray(got)[keep], ref.numpy()[keep]) < RTOL
    else:
        assert relative_error(got, ref) < RTOL


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("DistilBertModel", "n_heads", 3),
        ("DistilBertModel", "activation", "prelu"),
        ("DistilBertForMaskedLM", "activation", "no_such_activation"),
        ("DistilBertModel", "pad_token_id", 50),
        ("DistilBertForSequenceClassification", "seq_classif_dropout", 2.0),
        ("DistilBertForTokenClassification", "dropout", -0.5),
        ("DistilBertModel", "sinusoidal_pos_embds", "yes"),
        ("DistilBertModel", "dim", 0),
        ("DistilBertForTokenClassification", "num_labels", 0),
    ],
)
def test_refused_config_values_name_class_and_key(name: str, key: str, value: Any) -> None:
    cls = getattr(distilbert, name)
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert name in message and key in message and repr(value) in message


def test_aliases_and_defaults_are_the_config_classes() -> None:
    config = {"vocab_size": 40, "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1}
    model = distilbert.DistilBertModel.from_config(config, key=jax.random.key(0))
    assert model.embeddings.word_embeddings.weight.shape == (40, 16)
    assert model.transformer.layer.layers.attention.q_lin.weight.shape == (1, 16, 16)
    shapes = tm.filter_eval_shape(
        lambda: distilbert.DistilBertModel.from_config({}, key=jax.random.key(0))
    )
    defaults = transformers.DistilBertConfig()
    assert shapes.embeddings.word_embeddings.weight.shape == (defaults.vocab_size, defaults.dim)


def test_dropout_runs_only_in_training_mode_and_bfloat16_builds() -> None:
    model = distilbert.DistilBertForSequenceClassification.from_config(TINY, key=jax.random.key(0))
    check_dropout(model, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    half = distilbert.DistilBertForSequenceClassification.from_config(
        TINY, key=jax.random.key(0), dtype=jax.numpy.bfloat16
    )
    out = run(half, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    assert out.dtype == jax.numpy.bfloat16 and bool(jax.numpy.isfinite(out).all())
