"""T5 (`T5Model`, `T5ForConditionalGeneration`, `T5EncoderModel`) against `transformers`' own:
float32 outputs within 1e-5 relative with padded inputs on either side, the relative position
buckets, labels shifted right, directories both ways (tied and untied heads as `transformers`
writes them), a hypothesis test over the config values, refused values named, LoRA with
PEFT's `q`/`v` names. Generation: `test_generate_seq2seq.py`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import peft
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import RTOL, pair, relative_error, run

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models._t5_layers import bucket_table
from treemod.models.t5 import (
    T5EncoderModel,
    T5ForConditionalGeneration,
    T5ForSequenceClassification,
    T5ForTokenClassification,
    T5Model,
)

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

BASE = {
    "vocab_size": 60,
    "d_model": 16,
    "d_kv": 4,
    "d_ff": 24,
    "num_layers": 2,
    "num_decoder_layers": 3,
    "num_heads": 4,
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 12,
    "decoder_start_token_id": 0,
}
T = transformers
HF = {
    T5Model: T.T5Model,
    T5ForConditionalGeneration: T.T5ForConditionalGeneration,
    T5EncoderModel: T.T5EncoderModel,
}


def _pair(cls: Any, config: dict[str, Any], attn: str = "eager") -> tuple[Any, Any]:
    return pair(HF[cls], T.T5Config, cls, config, attn)


def _inputs(cls: Any, batch: int = 3, src: int = 9, tgt: int = 14) -> dict[str, np.ndarray]:
    """Encoder inputs padded on the left (row 1) and the right (row 2); a padded decoder row."""
    rng = np.random.default_rng(0)
    mask = np.ones((batch, src), np.int64)
    mask[1, :2] = 0
    mask[2, -3:] = 0
    inputs = {"input_ids": rng.integers(2, 60, (batch, src)), "attention_mask": mask}
    if cls is not T5EncoderModel:
        dec_mask = np.ones((batch, tgt), np.int64)
        dec_mask[2, -4:] = 0
        inputs["decoder_input_ids"] = rng.integers(2, 60, (batch, tgt))
        inputs["decoder_attention_mask"] = dec_mask
    return inputs


def _hf_out(hf: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        out = hf(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("cls", list(HF), ids=lambda c: c.__name__)
def test_padded_inputs_match_transformers(cls: Any, attn: str) -> None:
    # Distances beyond max_distance (12) reach the last, shared buckets.
    hf, model = _pair(cls, BASE, attn)
    inputs = _inputs(cls, src=9, tgt=20)
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL


def test_buckets_are_transformers() -> None:
    relative = torch.arange(-300, 301)
    bucket = T.models.t5.modeling_t5.T5Attention._relative_position_bucket
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 12), (4, 3), (6, 1000), (33, 50)):
            want = bucket(relative, bidirectional, buckets, distance).numpy()
            got = np.asarray(bucket_table(300, bidirectional, buckets, distance))
            np.testing.assert_array_equal(got, want, err_msg=f"{bidirectional, buckets, distance}")


def test_labels_shift_right_and_heads() -> None:
    hf, model = _pair(T5ForConditionalGeneration, {**BASE, "feed_forward_proj": "gated-gelu"})
    inputs = _inputs(T5ForConditionalGeneration)
    labels = inputs.pop("decoder_input_ids")
    labels[0, 3:] = -100
    del inputs["decoder_attention_mask"]
    inputs["labels"] = labels
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL
    cfg = {k: v for k, v in BASE.items() if k != "decoder_start_token_id"}
    skeleton = tm.filter_eval_shape(
        lambda: T5ForConditionalGeneration.from_config(cfg, key=jax.random.key(0))
    )
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        tm.filter_eval_shape(lambda m: m(input_ids=inputs["input_ids"], labels=labels), skeleton)


def _hf_model(cls: Any, config: dict[str, Any]) -> Any:
    torch.manual_seed(0)
    hf = HF[cls](T.T5Config(**config))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return hf.eval()


def _both_ways(hf: Any, tmp_path: Path, cls: Any) -> Any:
    inputs = _inputs(cls)
    want = _hf_out(hf, inputs)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is cls
    assert relative_error(run(model, inputs), want) <= RTOL
    save_pretrained(model, tmp_path / "tm")
    back, info = type(hf).from_pretrained(tmp_path / "tm", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    for name, value in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    assert relative_error(_hf_out(back.eval(), inputs), want) <= RTOL
    return model


@pytest.mark.parametrize("cls", list(HF), ids=lambda c: c.__name__)
def test_both_ways_through_directories(cls: Any, tmp_path: Path) -> None:
    model = _both_ways(_hf_model(cls, BASE), tmp_path, cls)
    assert "shared.weight" in tm.state_dict(model)
    from safetensors.numpy import load_file

    written = load_file(str(tmp_path / "tm" / "model.safetensors"))
    assert not any("embed_tokens" in n or "lm_head" in n for n in written)


def test_untied_head_files_load_both_ways(tmp_path: Path) -> None:
    """flan-t5's files: `tie_word_embeddings: false` and their own `lm_head.weight` (no
    output scaling); transformers 5 writes them back with `scale_decoder_outputs: false`."""
    from safetensors.numpy import load_file, save_file

    cls = T5ForConditionalGeneration
    _hf_model(cls, {**BASE, "feed_forward_proj": "gated-gelu"}).save_pretrained(tmp_path / "a")
    file = tmp_path / "a" / "model.safetensors"
    tensors = load_file(str(file))
    tensors["lm_head.weight"] = np.random.default_rng(1).standard_normal((60, 16), np.float32)
    save_file(tensors, str(file), {"format": "pt"})
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config.pop("scale_decoder_outputs")
    config["tie_word_embeddings"] = False
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    hf = T.T5ForConditionalGeneration.from_pretrained(tmp_path / "a").eval()
    assert hf.lm_head.weight is not hf.shared.weight
    model = _both_ways(hf, tmp_path / "b", cls)
    assert model.lm_head is not None and "lm_head.weight" not in model.tied_weights()


def _config(draw: Any) -> dict[str, Any]:
    buckets = draw(st.sampled_from([4, 8, 32]))
    return {
        "vocab_size": 40,
        "d_model": draw(st.sampled_from([8, 16])),
        "d_kv": draw(st.sampled_from([2, 6])),
        "d_ff": draw(st.sampled_from([8, 20])),
        "num_layers": draw(st.integers(1, 2)),
        "num_decoder_layers": draw(st.sampled_from([None, 1, 3])),
        "num_heads": draw(st.sampled_from([1, 3])),
        "relative_attention_num_buckets": buckets,
        "relative_attention_max_distance": draw(st.sampled_from([buckets // 2 + 1, 20, 128])),
        "layer_norm_epsilon": draw(st.sampled_from([1e-6, 1e-2])),
        "feed_forward_proj": draw(
            st.sampled_from(["relu", "gated-gelu", "gated-silu", "gelu_new", "gated-relu"])
        ),
        "tie_word_embeddings": draw(st.sampled_from([None, True, False])),
        "decoder_start_token_id": 0,
    }


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_config_values_match_transformers(data: Any) -> None:
    config = {k: v for k, v in _config(data.draw).items() if v is not None}
    hf, model = _pair(T5ForConditionalGeneration, config)
    assert (model.lm_head is None) == (config.get("tie_word_embeddings") is not False)
    inputs = _inputs(T5ForConditionalGeneration, batch=3, src=7, tgt=25)
    inputs = {k: np.minimum(v, 39) for k, v in inputs.items()}
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL


@pytest.mark.parametrize(
    "cls, change, key",
    [
        (T5Model, {"feed_forward_proj": "gated-gelu-x"}, "feed_forward_proj"),
        (T5Model, {"feed_forward_proj": "swiglu-gelu"}, "feed_forward_proj"),
        (T5ForConditionalGeneration, {"feed_forward_proj": "gated-prelu"}, "dense_act_fn"),
        (T5ForConditionalGeneration, {"dense_act_fn": "nope"}, "dense_act_fn"),
        (T5Model, {"relative_attention_num_buckets": 2}, "relative_attention_num_buckets"),
        (T5Model, {"relative_attention_max_distance": 4}, "relative_attention_max_distance"),
        (T5Model, {"d_kv": 0}, "d_kv"),
        (T5Model, {"dropout_rate": 1.5}, "dropout_rate"),
        (T5Model, {"layer_norm_epsilon": 0}, "layer_norm_epsilon"),
        (T5EncoderModel, {"is_decoder": True}, "is_decoder"),
    ],
)
def test_refused_config_values_are_named(cls: Any, change: dict[str, Any], key: str) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**BASE, **change}, key=jax.random.key(0))
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}: config value {key}=")
    assert "not supported" in message


def test_names_and_dropout() -> None:
    hf, model = _pair(T5ForConditionalGeneration, BASE)
    names = set(tm.state_dict(model)) | set(model.tied_weights())
    assert names == set(hf.state_dict())
    inputs = _inputs(T5ForConditionalGeneration)
    trained = tm.nn.inference_mode(model, False)
    dropped = run(trained, {**inputs, "key": jax.random.key(1)})
    assert not np.allclose(dropped, run(model, inputs))  # dropout acts in training mode only


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_matches_peft(tmp_path: Path) -> None:
    hf, model = _pair(T5ForConditionalGeneration, BASE)
    tuned = lora.add_lora(model, ["q", "v"], r=2, alpha=4, key=jax.random.key(3))
    tuned = jax.tree.map(lambda x: x, tuned)
    names = [n for n in tm.state_dict(tuned) if n.endswith("lora_B.weight")]
    assert len(names) == 2 * (2 + 3 + 3)  # encoder self, decoder self and cross attentions
    state = tm.state_dict(tuned)
    rng = np.random.default_rng(2)
    state.update({n: 0.3 * rng.standard_normal(state[n].shape, np.float32) for n in names})
    tuned = tm.load_state_dict(tuned, state)
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    inputs = _inputs(T5ForConditionalGeneration)
    want = _hf_out(reference, inputs)
    assert relative_error(run(tuned, inputs), want) <= RTOL
    assert relative_error(run(model, inputs), want) > 1e-3


@pytest.mark.parametrize(
    "cls, hf_cls",
    [
        (T5ForSequenceClassification, T.T5ForSequenceClassification),
        (T5ForTokenClassification, T.T5ForTokenClassification),
    ],
    ids=["sequence", "token"],
)
def test_classification_heads_both_ways(cls: Any, hf_cls: Any, tmp_path: Path) -> None:
    config = {**BASE, "num_labels": 3, "eos_token_id": 1}
    torch.manual_seed(0)
    hf = hf_cls(T.T5Config(**config))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf.eval()
    inputs = _inputs(T5EncoderModel)
    inputs["input_ids"][:, -1] = 1  # one end-of-sequence token per row, where rows end
    inputs["input_ids"][1, 4] = 1  # and two in row 1: the last one counts
    inputs["input_ids"][0, 2] = 1
    inputs["input_ids"][2, 5] = 1
    want = _hf_out(hf, inputs)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is cls
    assert relative_error(run(model, inputs), want) <= RTOL
    save_pretrained(model, tmp_path / "tm")
    back, info = hf_cls.from_pretrained(tmp_path / "tm", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert relative_error(_hf_out(back.eval(), inputs), want) <= RTOL


def test_hub_files_with_aliases_and_the_old_cross_attention_bias_load(tmp_path: Path) -> None:
    """Older T5 files hold the embedding under every alias (`encoder.embed_tokens.weight`,
    `decoder.embed_tokens.weight`, `lm_head.weight`) and a cross-attention bias transformers
    skips (`decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight`)."""
    from safetensors.numpy import load_file, save_file

    hf = _hf_model(T5ForConditionalGeneration, BASE)
    hf.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    tensors = load_file(str(file))
    for alias in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        tensors[alias] = tensors["shared.weight"]
    old = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    tensors[old] = np.ones((8, 4), np.float32)
    save_file(tensors, str(file), {"format": "pt"})
    inputs = _inputs(T5ForConditionalGeneration)
    assert relative_error(run(from_pretrained(tmp_path), inputs), _hf_out(hf, inputs)) <= RTOL
    # T5EncoderModel skips the whole decoder, as transformers does (not the head).
    encoder, report = from_pretrained(tmp_path, architecture="T5EncoderModel", strict=False)
    assert report.unexpected == ("lm_head.weight",) and not report.missing
    inputs = _inputs(T5EncoderModel)
    assert relative_error(run(encoder, inputs), _hf_out(hf.encoder, inputs)) <= RTOL
