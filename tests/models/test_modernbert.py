"""ModernBERT (`ModernBertModel` and its masked-LM, sequence and token classifiers) against
`transformers`.

Reference: `transformers`' own classes, random-initialised from small configs in the test, in
`eval()` mode, with eager and SDPA attention. Float32 outputs agree within 1e-5 relative (max
abs error over max abs value) on the real tokens of left-padded batches. Hypothesis covers the
config values the classes read; every refused value raises a `CheckpointError` naming the class
and the config key.
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
from treemod.models.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

CLASSES = {
    "ModernBertModel": (ModernBertModel, transformers.ModernBertModel),
    "ModernBertForMaskedLM": (ModernBertForMaskedLM, transformers.ModernBertForMaskedLM),
    "ModernBertForSequenceClassification": (
        ModernBertForSequenceClassification,
        transformers.ModernBertForSequenceClassification,
    ),
    "ModernBertForTokenClassification": (
        ModernBertForTokenClassification,
        transformers.ModernBertForTokenClassification,
    ),
}
TINY = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 40,
    "max_position_embeddings": 64,
    "local_attention": 4,  # windows of 2 either side: shorter than the test sequences
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}
ACTS = sorted(set(transformers.activations.ACT2CLS) - {"prelu", "xielu"})
# Before the head's norm over a few features: laplace (erf of x / 0.4) turns torch's and XLA's
# last-bit erf differences into 2e-5 relative; the activation itself is tested in the layers.
HEAD_ACTS = [a for a in ACTS if a != "laplace"]
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


def _hf(name: str, config: dict[str, Any], attn: str = "eager", seed: int = 0) -> Any:
    torch.manual_seed(seed)
    hf_config = transformers.ModernBertConfig(**config)
    hf_config._attn_implementation = attn
    model = CLASSES[name][1](hf_config).eval()
    # transformers' initial weights (std 0.02, truncated) make the head's activations nearly
    # constant, so its norm over a few features divides rounding by a tiny spread; weights of
    # std 0.5 compare the computation rather than the conditioning.
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


def _inputs(
    rng: np.random.Generator, batch: int, seq: int, vocab: int, left: bool = True
) -> dict[str, Any]:
    """Token ids and a mask with padding on the left (or right), at least one real token.

    Padded positions differ between transformers' own eager attention (a query with no key in
    its window averages every value; treemod's too) and SDPA (zeros), and no real token reads
    them. "cls" pooling reads position 0, so its tests pad on the right, as ModernBERT's
    tokenizer does.
    """
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        pad = rng.integers(0, seq)
        mask[b, :pad] = 0
        if not left:
            mask[b] = mask[b, ::-1]
    return {"input_ids": rng.integers(0, vocab, (batch, seq)), "attention_mask": mask}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_equals_transformers_on_left_padded_batches(name: str, attn: str) -> None:
    pooling = "mean" if attn == "eager" else "cls"
    config = {**TINY, "classifier_pooling": pooling}
    hf = _hf(name, config, attn)
    model = _ours(name, hf)
    left = not ("Sequence" in name and pooling == "cls")
    inputs = _inputs(np.random.default_rng(0), 3, 9, TINY["vocab_size"], left)
    inputs["attention_mask"][0] = 1  # one row without padding
    got = _run(model, inputs)
    assert _relative_error(got, _reference(hf, inputs), inputs["attention_mask"]) < 1e-5


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
    inputs = _inputs(np.random.default_rng(6), 2, 7, TINY["vocab_size"], "Sequence" not in name)
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5
    save_pretrained(model, tmp_path / "ours")
    again, info = CLASSES[name][1].from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    for k, v in hf.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    assert _relative_error(_run(model, inputs), _reference(again.eval(), inputs), keep) < 1e-5


def test_untied_decoder_without_bias_round_trips() -> None:
    config = {**TINY, "tie_word_embeddings": False, "decoder_bias": False}
    model = ModernBertForMaskedLM.from_config(config, key=jax.random.key(3))
    assert model.tied_weights() == {} and model.decoder.bias is None
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in tm.state_dict(model).items()}
    hf = _hf("ModernBertForMaskedLM", config)
    hf.load_state_dict(tensors, strict=True)
    inputs = _inputs(np.random.default_rng(1), 2, 7, TINY["vocab_size"])
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


def test_position_ids_inputs_embeds_and_old_config_keys() -> None:
    # Hub configs written before layer_types and rope_parameters existed.
    old = {
        **TINY,
        "global_attn_every_n_layers": 2,
        "global_rope_theta": 1000.0,
        "local_rope_theta": 77.0,
        "num_hidden_layers": 4,
    }
    hf = _hf("ModernBertModel", old)
    model = ModernBertModel.from_config(old, key=jax.random.key(0))
    assert [layer.local for layer in model.layers] == [False, True, False, True]
    model = tm.load_state_dict(model, dict(hf.state_dict()))
    rng = np.random.default_rng(2)
    inputs = _inputs(rng, 2, 8, TINY["vocab_size"])
    inputs["position_ids"] = rng.integers(0, 30, (2, 8))
    keep = inputs["attention_mask"]
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5
    embeds = rng.standard_normal((2, 8, TINY["hidden_size"])).astype(np.float32)
    by_embeds = {"inputs_embeds": embeds, "attention_mask": keep}
    assert _relative_error(_run(model, by_embeds), _reference(hf, by_embeds), keep) < 1e-5


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_config_space_equals_transformers(data: st.DataObject) -> None:
    heads = data.draw(st.sampled_from([1, 2, 4]), "heads")
    layers = data.draw(st.integers(1, 4), "layers")
    config: dict[str, Any] = {
        "vocab_size": data.draw(st.integers(8, 40), "vocab"),
        "hidden_size": heads * data.draw(st.sampled_from([4, 8]), "head_dim"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": data.draw(st.integers(4, 40), "intermediate"),
        "hidden_activation": data.draw(st.sampled_from(ACTS), "act"),
        "classifier_activation": data.draw(st.sampled_from(HEAD_ACTS), "classifier act"),
        "norm_eps": data.draw(st.sampled_from([1e-5, 1e-2]), "eps"),
        "norm_bias": data.draw(st.booleans(), "norm_bias"),
        "attention_bias": data.draw(st.booleans(), "attention_bias"),
        "mlp_bias": data.draw(st.booleans(), "mlp_bias"),
        "decoder_bias": data.draw(st.booleans(), "decoder_bias"),
        "classifier_bias": data.draw(st.booleans(), "classifier_bias"),
        "classifier_pooling": data.draw(st.sampled_from(["cls", "mean"]), "pooling"),
        "local_attention": data.draw(st.integers(0, 12), "window"),
        "global_attn_every_n_layers": data.draw(st.integers(1, 3), "every"),
        "global_rope_theta": data.draw(st.sampled_from([160000.0, 500.0]), "global theta"),
        "local_rope_theta": data.draw(st.sampled_from([10000.0, 50.0]), "local theta"),
        "tie_word_embeddings": data.draw(st.booleans(), "tie"),
        "num_labels": data.draw(st.integers(1, 4), "labels"),
        "pad_token_id": data.draw(st.sampled_from([None, 0, 3]), "pad"),
        **{f"{t}_token_id": None for t in ("bos", "eos", "cls", "sep")},
    }
    if data.draw(st.booleans(), "linear rope"):
        config["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    name = data.draw(st.sampled_from(sorted(CLASSES)), "class")
    hf = _hf(name, config, data.draw(st.sampled_from(["eager", "sdpa"]), "attn"))
    model = _ours(name, hf)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    left = not ("Sequence" in name and config["classifier_pooling"] == "cls")
    inputs = _inputs(rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12)), 8, left)
    if data.draw(st.booleans(), "drop mask"):
        del inputs["attention_mask"]
    keep = inputs.get("attention_mask")
    assert _relative_error(_run(model, inputs), _reference(hf, inputs), keep) < 1e-5


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (ModernBertModel, "hidden_activation", "prelu"),
        (ModernBertForMaskedLM, "classifier_activation", "no_such_activation"),
        (ModernBertModel, "num_attention_heads", 3),
        (ModernBertModel, "head_dim", 16),
        (ModernBertModel, "layer_types", ["full_attention"]),
        (ModernBertForTokenClassification, "layer_types", ["full_attention", "x", "x"]),
        (ModernBertForSequenceClassification, "classifier_pooling", "max"),
        (ModernBertModel, "rope_scaling", {"rope_type": "yarn", "factor": 2.0}),
        (ModernBertModel, "norm_eps", 0.0),
        (ModernBertModel, "mlp_dropout", 1.5),
        (ModernBertModel, "pad_token_id", 50),
        (ModernBertForSequenceClassification, "num_labels", 5),  # id2label holds 2
    ],
)
def test_refused_config_values_name_class_and_key(cls: Any, key: str, value: Any) -> None:
    config = {**TINY, key: value}
    if key == "num_labels":
        config["id2label"] = {"0": "a", "1": "b"}
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config(config, key=jax.random.key(0))
    message = str(info.value)
    key_named = key.split(".")[0] if key != "rope_scaling" else "rope_type"
    assert cls.__name__ in message and key_named in message


def test_lora_on_wqkv_equals_peft(tmp_path: Any) -> None:
    hf = _hf("ModernBertForMaskedLM", TINY)
    model = _ours("ModernBertForMaskedLM", hf)
    tuned = lora.add_lora(model, ["Wqkv"], r=4, alpha=8, key=jax.random.key(3))
    keys = iter(jax.random.split(jax.random.key(4), 10))

    def randomise(layer: Any) -> Any:
        b = layer.lora_B.weight
        return tm.tree_at(lambda x: x.lora_B.weight, layer, jax.random.normal(next(keys), b.shape))

    tuned = tm.tree_at(
        lambda m: [layer.attn.Wqkv for layer in m.model.layers],
        tuned,
        [randomise(layer.attn.Wqkv) for layer in tuned.model.layers],
    )
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    inputs = _inputs(np.random.default_rng(5), 2, 6, TINY["vocab_size"])
    keep = inputs["attention_mask"]
    want = _reference(reference, inputs)
    assert _relative_error(_run(tuned, inputs), want, keep) < 1e-5
    assert _relative_error(_run(model, inputs), want, keep) > 1e-3


def test_builds_under_filter_eval_shape_and_in_bfloat16() -> None:
    shapes = tm.filter_eval_shape(
        lambda: ModernBertForMaskedLM.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    )
    assert shapes.model.layers[1].attn.Wqkv.weight.shape == (96, 32)
    model = ModernBertModel.from_config(TINY, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = _run(model, {"input_ids": np.array([[1, 2, 3]])})
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())


def test_dropout_runs_only_in_training_mode() -> None:
    config = {**TINY, "embedding_dropout": 0.5, "mlp_dropout": 0.5, "attention_dropout": 0.5}
    model = ModernBertModel.from_config(config, key=jax.random.key(0))
    inputs = {"input_ids": np.array([[1, 2, 3, 4]])}
    evaluation = _run(model, inputs)
    assert bool(jnp.array_equal(evaluation, _run(model, {**inputs, "key": jax.random.key(1)})))
    training = tm.nn.inference_mode(model, False)
    a = _run(training, {**inputs, "key": jax.random.key(1)})
    b = _run(training, {**inputs, "key": jax.random.key(2)})
    assert not bool(jnp.allclose(a, evaluation)) and not bool(jnp.allclose(a, b))


def test_bad_inputs_are_named() -> None:
    model = ModernBertModel.from_config(TINY, key=jax.random.key(0))
    with pytest.raises(ValueError, match="ModernBertModel: give exactly one of input_ids"):
        model(attention_mask=np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(3,\)"):
        model(input_ids=np.array([[1, 2, 3]]), attention_mask=np.ones(3))
