"""MPNet against `transformers` (see `bert_family_checks.py`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import torch
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
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

import treemod as tm
from treemod.models import mpnet
from treemod.models._mpnet import relative_position_bucket

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 160,
    "num_labels": 3,
}


def classes(head: str) -> tuple[Any, Any]:
    name = "MPNet" + head
    return getattr(mpnet, name), getattr(transformers, name)


def pair(head: str, config: dict[str, Any] = TINY) -> tuple[Any, Any]:
    ours, hf_cls = classes(head)
    hf = hf_model(hf_cls, transformers.MPNetConfig, config)
    return hf, twin(ours, hf)


def test_buckets_equal_transformers_at_every_distance() -> None:
    relative = np.arange(-400, 401)
    want = MPNetEncoder.relative_position_bucket(torch.from_numpy(relative)).numpy()
    np.testing.assert_array_equal(relative_position_bucket(relative), want)


@pytest.mark.parametrize("head", HEADS)
def test_left_and_right_padding_equal_transformers(head: str) -> None:
    hf, model = pair(head)
    check_padding(model, hf, TINY, pad=1)


def test_long_sequences_use_the_logarithmic_buckets() -> None:
    hf, model = pair("Model")
    inputs = padded(np.random.default_rng(0), 2, 150, TINY["vocab_size"], 1, "left")
    ref, got = reference(hf, inputs), run(model, inputs)
    keep = inputs["attention_mask"].astype(bool)
    assert relative_error(np.asarray(got)[keep], ref.numpy()[keep]) < RTOL
    # One table for every layer: the bias is not per layer.
    assert model.encoder.relative_attention_bias.weight.shape == (32, TINY["num_attention_heads"])


@pytest.mark.parametrize("head", HEADS)
def test_save_pretrained_round_trips(head: str, tmp_path: Any) -> None:
    ours, hf_cls = classes(head)
    hf, _ = pair(head)
    inputs = padded(np.random.default_rng(1), 2, 6, TINY["vocab_size"], 1, "left")
    check_round_trip(ours, hf_cls, hf, tmp_path, inputs)


def test_position_ids_and_inputs_embeds() -> None:
    hf, model = pair("Model")
    rng = np.random.default_rng(2)
    embeds = rng.standard_normal((2, 5, TINY["hidden_size"])).astype(np.float32)
    ids = rng.integers(2, TINY["vocab_size"], (2, 5))
    for inputs in (
        {"inputs_embeds": embeds},
        {"input_ids": ids, "position_ids": rng.integers(0, 20, (2, 5))},
    ):
        assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL


@pytest.mark.parametrize("tie", [True, False])
def test_masked_lm_ties_decoder_weight_and_bias(tie: bool, tmp_path: Any) -> None:
    config = {**TINY, "tie_word_embeddings": tie}
    model = mpnet.MPNetForMaskedLM.from_config(config, key=jax.random.key(2))
    bias = jax.numpy.linspace(-1, 1, TINY["vocab_size"])
    model = tm.tree_at(lambda m: m.lm_head.bias, model, bias)
    tm.models.save_pretrained(model, tmp_path)
    hf = transformers.MPNetForMaskedLM.from_pretrained(tmp_path).eval()
    assert (hf.lm_head.decoder.weight is hf.mpnet.embeddings.word_embeddings.weight) == tie
    inputs = padded(np.random.default_rng(5), 2, 6, TINY["vocab_size"], 1, "right")
    assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL


def test_old_position_ids_buffer_is_skipped(tmp_path: Any) -> None:
    hf, _ = pair("ForMaskedLM")
    ours, hf_cls = classes("ForMaskedLM")
    check_position_ids_skipped(ours, hf_cls, hf, tmp_path)


# PEFT 0.21 reads transformers' deprecated property; the warning is theirs, not treemod's.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_with_peft_names(tmp_path: Any) -> None:
    hf, model = pair("ForTokenClassification")
    inputs = padded(np.random.default_rng(7), 2, 6, TINY["vocab_size"], 1, "left")
    check_lora(model, hf, ["q", "v"], inputs, tmp_path)


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    config = {
        "vocab_size": data.draw(st.integers(8, 40), "vocab"),
        "hidden_size": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "num_hidden_layers": data.draw(st.integers(1, 2), "layers"),
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 40), "intermediate"),
        "hidden_act": data.draw(st.sampled_from(["gelu", "relu", "gelu_new", "silu"]), "act"),
        "layer_norm_eps": data.draw(st.sampled_from([1e-12, 1e-5, 1e-2]), "eps"),
        "max_position_embeddings": data.draw(st.integers(40, 48), "positions"),
        "relative_attention_num_buckets": data.draw(st.sampled_from([32, 40]), "buckets"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
    }
    head = data.draw(st.sampled_from(HEADS), "head")
    hf, model = pair(head, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    side = data.draw(st.sampled_from(["left", "right"]), "side")
    inputs = padded(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 30)),
                    config["vocab_size"], 1, side)  # fmt: skip
    ref, got = reference(hf, inputs), run(model, inputs)
    keep = inputs["attention_mask"].astype(bool)
    if got.ndim == 3:
        assert relative_error(np.asarray(got)[keep], ref.numpy()[keep]) < RTOL
    else:
        assert relative_error(got, ref) < RTOL


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("MPNetModel", "relative_attention_num_buckets", 16),
        ("MPNetModel", "num_attention_heads", 3),
        ("MPNetForMaskedLM", "hidden_act", "prelu"),
        ("MPNetModel", "vocab_size", 1),
        ("MPNetModel", "max_position_embeddings", 1),
        ("MPNetForSequenceClassification", "hidden_dropout_prob", 1.5),
        ("MPNetForTokenClassification", "layer_norm_eps", -1.0),
        ("MPNetForTokenClassification", "num_labels", 0),
    ],
)
def test_refused_config_values_name_class_and_key(name: str, key: str, value: Any) -> None:
    cls = getattr(mpnet, name)
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert name in message and key in message and repr(value) in message


def test_defaults_are_the_config_class() -> None:
    shapes = tm.filter_eval_shape(lambda: mpnet.MPNetModel.from_config({}, key=jax.random.key(0)))
    defaults = transformers.MPNetConfig()
    word = shapes.embeddings.word_embeddings.weight
    assert word.shape == (defaults.vocab_size, defaults.hidden_size)


def test_dropout_runs_only_in_training_mode_and_bfloat16_builds() -> None:
    model = mpnet.MPNetForTokenClassification.from_config(TINY, key=jax.random.key(0))
    check_dropout(model, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    half = mpnet.MPNetForTokenClassification.from_config(
        TINY, key=jax.random.key(0), dtype=jax.numpy.bfloat16
    )
    out = run(half, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    assert out.dtype == jax.numpy.bfloat16 and bool(jax.numpy.isfinite(out).all())
