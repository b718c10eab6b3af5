"""RoBERTa and XLM-RoBERTa against `transformers` (see `bert_family_checks.py`)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import safetensors.numpy
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
from treemod.models import roberta, xlm_roberta

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
FAMILIES = {
    "Roberta": (roberta, transformers.RobertaConfig),
    "XLMRoberta": (xlm_roberta, transformers.XLMRobertaConfig),
}
CASES = [(f, h) for f in FAMILIES for h in HEADS]
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 20,
    "num_labels": 3,
}


def classes(family: str, head: str) -> tuple[Any, Any, Any]:
    module, config_cls = FAMILIES[family]
    name = family + head
    return getattr(module, name), getattr(transformers, name), config_cls


def pair(family: str, head: str, config: dict[str, Any] = TINY) -> tuple[Any, Any]:
    ours, hf_cls, config_cls = classes(family, head)
    hf = hf_model(hf_cls, config_cls, config)
    return hf, twin(ours, hf)


@pytest.mark.parametrize(
    ("family", "head"), [("Roberta", h) for h in HEADS] + [("XLMRoberta", "Model")]
)
def test_left_and_right_padding_equal_transformers(family: str, head: str) -> None:
    hf, model = pair(family, head)
    check_padding(model, hf, TINY, pad=1)


def test_positions_count_real_tokens_from_pad_plus_one() -> None:
    hf, model = pair("Roberta", "Model")
    ids = np.array([[1, 1, 5, 6], [5, 6, 1, 1]])
    mask = (ids != 1).astype(np.int64)
    out = run(model, {"input_ids": ids, "attention_mask": mask})
    # The same two tokens at the same positions whichever side the padding is on.
    np.testing.assert_allclose(out[0, 2:], out[1, :2], rtol=1e-5, atol=1e-5)
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((2, 5, TINY["hidden_size"])).astype(np.float32)
    explicit = {"input_ids": ids, "position_ids": np.array([[3, 2, 4, 5], [2, 3, 4, 5]])}
    for inputs in ({"inputs_embeds": embeds}, explicit):
        assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL


@pytest.mark.parametrize(
    ("family", "head"), CASES[:4] + [("XLMRoberta", "Model"), ("XLMRoberta", "ForMaskedLM")]
)
def test_save_pretrained_round_trips(family: str, head: str, tmp_path: Any) -> None:
    ours, hf_cls, _ = classes(family, head)
    hf, _ = pair(family, head)
    inputs = padded(np.random.default_rng(1), 2, 6, TINY["vocab_size"], 1, "left")
    check_round_trip(ours, hf_cls, hf, tmp_path, inputs)


@pytest.mark.parametrize("tie", [True, False])
def test_masked_lm_ties_decoder_weight_and_bias(tie: bool, tmp_path: Any) -> None:
    config = {**TINY, "tie_word_embeddings": tie}
    model = roberta.RobertaForMaskedLM.from_config(config, key=jax.random.key(2))
    bias = jax.numpy.linspace(-1, 1, TINY["vocab_size"])
    model = tm.tree_at(lambda m: m.lm_head.bias, model, bias)
    if not tie:
        model = tm.tree_at(lambda m: m.lm_head.decoder.bias, model, bias * 2)
    tm.models.save_pretrained(model, tmp_path)
    hf = transformers.RobertaForMaskedLM.from_pretrained(tmp_path).eval()
    same = hf.lm_head.decoder.weight is hf.roberta.embeddings.word_embeddings.weight
    assert same == tie and (hf.lm_head.decoder.bias is hf.lm_head.bias) == tie
    inputs = padded(np.random.default_rng(5), 2, 6, TINY["vocab_size"], 1, "right")
    assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL
    assert model.tied_weights() == (
        {
            "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
            "lm_head.decoder.bias": "lm_head.bias",
        }
        if tie
        else {}
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_old_position_ids_buffer_is_skipped(family: str, tmp_path: Any) -> None:
    ours, hf_cls, _ = classes(family, "ForMaskedLM")
    hf, _ = pair(family, "ForMaskedLM")
    check_position_ids_skipped(ours, hf_cls, hf, tmp_path)


# PEFT 0.21 reads transformers' deprecated property; the warning is theirs, not treemod's.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("head", ["ForSequenceClassification", "ForTokenClassification"])
def test_lora_with_peft_names(head: str, tmp_path: Any) -> None:
    hf, model = pair("Roberta", head)
    inputs = padded(np.random.default_rng(7), 2, 6, TINY["vocab_size"], 1, "left")
    check_lora(model, hf, ["query", "value"], inputs, tmp_path)


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
        "max_position_embeddings": data.draw(st.integers(16, 24), "positions"),
        "type_vocab_size": data.draw(st.integers(1, 3), "types"),
        "pad_token_id": data.draw(st.sampled_from([0, 1, 3]), "pad"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "classifier_dropout": data.draw(st.sampled_from([None, 0.3]), "classifier_dropout"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
    }
    family = data.draw(st.sampled_from(sorted(FAMILIES)), "family")
    head = data.draw(st.sampled_from(HEADS), "head")
    hf, model = pair(family, head, config)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    side = data.draw(st.sampled_from(["left", "right"]), "side")
    inputs = padded(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 10)),
                    config["vocab_size"], config["pad_token_id"], side)  # fmt: skip
    if data.draw(st.booleans(), "token types"):
        inputs["token_type_ids"] = rng.integers(
            0, config["type_vocab_size"], inputs["input_ids"].shape
        )
    ref = reference(hf, inputs)
    got = run(model, inputs)
    keep = inputs["attention_mask"].astype(bool)
    if got.ndim == 3:
        assert relative_error(np.asarray(got)[keep], ref.numpy()[keep]) < RTOL
    else:
        assert relative_error(got, ref) < RTOL


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("RobertaModel", "pad_token_id", None),
        ("RobertaModel", "pad_token_id", 20),  # not a position below max_position_embeddings
        ("RobertaForMaskedLM", "is_decoder", True),
        ("RobertaForMaskedLM", "add_cross_attention", True),
        ("RobertaModel", "position_embedding_type", "relative_key"),
        ("RobertaForSequenceClassification", "hidden_act", "prelu"),
        ("RobertaForTokenClassification", "num_attention_heads", 3),
        ("RobertaForTokenClassification", "classifier_dropout", 1.5),
        ("XLMRobertaModel", "layer_norm_eps", 0),
        ("XLMRobertaForMaskedLM", "pad_token_id", -1),
        ("XLMRobertaForSequenceClassification", "num_labels", 0),
    ],
)
def test_refused_config_values_name_class_and_key(name: str, key: str, value: Any) -> None:
    module = roberta if name.startswith("Roberta") else xlm_roberta
    cls = getattr(module, name)
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**TINY, key: value}, key=jax.random.key(0))
    message = str(info.value)
    assert name in message and key in message and repr(value) in message


def test_every_class_is_registered_under_its_architecture() -> None:
    known = tm.models.registered_architectures()
    for family, head in CASES:
        ours, hf_cls, _ = classes(family, head)
        assert known[hf_cls.__name__] is ours and ours.architecture == hf_cls.__name__


def test_defaults_are_the_config_classes() -> None:
    for family, (module, config_cls) in FAMILIES.items():
        shapes = tm.filter_eval_shape(
            lambda m=module, f=family: getattr(m, f + "ForMaskedLM").from_config(
                {"num_hidden_layers": 1}, key=jax.random.key(0)
            )
        )
        word = shapes.roberta.embeddings.word_embeddings.weight
        defaults = config_cls()
        assert word.shape == (defaults.vocab_size, defaults.hidden_size)


def test_sequence_longer_than_positions_is_refused() -> None:
    model = roberta.RobertaModel.from_config(TINY, key=jax.random.key(0))
    with pytest.raises(ValueError, match="needs position 20; max_position_embeddings is 20"):
        model(input_ids=np.ones((1, 19), np.int64) * 5)


def test_dropout_runs_only_in_training_mode_and_bfloat16_builds() -> None:
    model = roberta.RobertaForSequenceClassification.from_config(TINY, key=jax.random.key(0))
    check_dropout(model, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    half = roberta.RobertaForSequenceClassification.from_config(
        TINY, key=jax.random.key(0), dtype=jax.numpy.bfloat16
    )
    out = run(half, {"input_ids": np.array([[0, 5, 6, 7, 2]])})
    assert out.dtype == jax.numpy.bfloat16 and bool(jax.numpy.isfinite(out).all())


def test_files_that_wrote_the_tied_names_load(tmp_path: Any) -> None:
    """Older transformers wrote `lm_head.decoder.weight` and `.bias` too: equal, they load."""
    hf, _ = pair("Roberta", "ForMaskedLM")
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    tensors["lm_head.decoder.weight"] = tensors["roberta.embeddings.word_embeddings.weight"]
    tensors["lm_head.decoder.bias"] = tensors["lm_head.bias"]
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    model = tm.models.from_pretrained(tmp_path)
    inputs = padded(np.random.default_rng(9), 2, 5, TINY["vocab_size"], 1, "left")
    assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL
