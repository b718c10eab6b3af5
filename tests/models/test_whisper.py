"""Whisper (`WhisperModel`, `WhisperForConditionalGeneration`) against `transformers`' own:
float32 outputs within 1e-5 relative (padded decoder rows, explicit positions, labels shifted
right), directories both ways (tied and untied heads), a hypothesis test over the config
values, refused values named, LoRA with PEFT's `q_proj`/`v_proj` names, and `generate_seq2seq`
equal to `transformers`' plain greedy decoding from the same decoder prompt."""

from __future__ import annotations

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
from transformers.generation.utils import GenerationMixin

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained
from treemod.models.whisper import (
    WhisperForAudioClassification,
    WhisperForConditionalGeneration,
    WhisperModel,
    generate_seq2seq,
    log_mel_features,
    mel_filters,
)

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

BASE = {
    "vocab_size": 60,
    "d_model": 16,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 24,
    "decoder_ffn_dim": 20,
    "num_mel_bins": 8,
    "max_source_positions": 12,
    "max_target_positions": 30,
    "decoder_start_token_id": 1,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # transformers' generation config would suppress these; generate_seq2seq does not.
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}
T = transformers
HF = {
    WhisperModel: T.WhisperModel,
    WhisperForConditionalGeneration: T.WhisperForConditionalGeneration,
}


def _pair(cls: Any, config: dict[str, Any] = BASE, attn: str = "eager") -> tuple[Any, Any]:
    return pair(HF[cls], T.WhisperConfig, cls, config, attn)


def _inputs(config: dict[str, Any] = BASE, batch: int = 2, tgt: int = 9) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    frames = 2 * config["max_source_positions"]
    mask = np.ones((batch, tgt), np.int64)
    mask[-1, -3:] = 0
    return {
        "input_features": rng.standard_normal((batch, config["num_mel_bins"], frames)).astype(
            np.float32
        ),
        "decoder_input_ids": rng.integers(0, config["vocab_size"], (batch, tgt)),
        "decoder_attention_mask": mask,
    }


def _hf_out(hf: Any, inputs: dict[str, Any]) -> np.ndarray:
    with torch.no_grad():
        out = hf(**{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("cls", list(HF), ids=lambda c: c.__name__)
def test_outputs_match_transformers(cls: Any, attn: str) -> None:
    hf, model = _pair(cls, attn=attn)
    inputs = _inputs()
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL
    positions = {**inputs, "decoder_position_ids": np.array([[3, 4, 5, 6, 7, 8, 9, 10, 11]])}
    assert relative_error(run(model, positions), _hf_out(hf, positions)) <= RTOL


def test_labels_and_input_checks() -> None:
    hf, model = _pair(WhisperForConditionalGeneration)
    inputs = _inputs()
    labels = inputs.pop("decoder_input_ids")
    del inputs["decoder_attention_mask"]
    labels[0, 4:] = -100
    inputs["labels"] = labels
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL
    with pytest.raises(ValueError, match=r"\(batch, num_mel_bins=8, 24\)"):
        model(input_features=np.zeros((1, 8, 20)), decoder_input_ids=labels)
    with pytest.raises(ValueError, match="exceed max_target_positions=30"):
        model(input_features=inputs["input_features"], labels=np.ones((2, 31), int))


def _hf_model(cls: Any, config: dict[str, Any]) -> Any:
    torch.manual_seed(0)
    hf = HF[cls](T.WhisperConfig(**config))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return hf.eval()


@pytest.mark.parametrize(
    "cls, tied",
    [
        (WhisperModel, True),
        (WhisperForConditionalGeneration, True),
        (WhisperForConditionalGeneration, False),
    ],
)
def test_both_ways_through_directories(cls: Any, tied: bool, tmp_path: Path) -> None:
    hf = _hf_model(cls, {**BASE, "tie_word_embeddings": tied})
    inputs = _inputs()
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
    if cls is WhisperForConditionalGeneration:
        assert (model.proj_out is None) == tied


def _config(draw: Any) -> dict[str, Any]:
    heads = draw(st.sampled_from([1, 2, 4]))
    return {
        **BASE,
        "d_model": heads * draw(st.sampled_from([2, 4])) * 2,
        "encoder_attention_heads": heads,
        "decoder_attention_heads": draw(st.sampled_from([1, 2])),
        "encoder_layers": draw(st.integers(1, 2)),
        "decoder_layers": draw(st.integers(1, 3)),
        "encoder_ffn_dim": draw(st.sampled_from([8, 20])),
        "num_mel_bins": draw(st.sampled_from([4, 8])),
        "max_source_positions": draw(st.sampled_from([5, 12])),
        "activation_function": draw(st.sampled_from(["gelu", "relu", "gelu_new", "silu"])),
        "tie_word_embeddings": draw(st.booleans()),
    }


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_config_values_match_transformers(data: Any) -> None:
    config = _config(data.draw)
    hf, model = _pair(WhisperForConditionalGeneration, config)
    inputs = _inputs(config)
    assert relative_error(run(model, inputs), _hf_out(hf, inputs)) <= RTOL


@pytest.mark.parametrize(
    "change, key",
    [
        ({"encoder_attention_heads": 3}, "encoder_attention_heads"),
        ({"decoder_attention_heads": 5}, "decoder_attention_heads"),
        ({"activation_function": "prelu"}, "activation_function"),
        ({"d_model": 2, "encoder_attention_heads": 1, "decoder_attention_heads": 1}, "d_model"),
        ({"encoder_layerdrop": 2}, "encoder_layerdrop"),
        ({"max_target_positions": 0}, "max_target_positions"),
    ],
)
def test_refused_config_values_are_named(change: dict[str, Any], key: str) -> None:
    cls = WhisperForConditionalGeneration
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**BASE, **change}, key=jax.random.key(0))
    assert str(info.value).startswith(f"{cls.__name__}: config value {key}=")


def test_training_only_features_are_refused_in_training_mode() -> None:
    for change in ({"apply_spec_augment": True}, {"decoder_layerdrop": 0.1}):
        model = tm.filter_eval_shape(
            lambda c=change: WhisperModel.from_config({**BASE, **c}, key=jax.random.key(0))
        )
        training = tm.nn.inference_mode(model, False)
        with pytest.raises(ValueError, match="which treemod does not implement"):
            tm.filter_eval_shape(lambda m: m(**_inputs()), training)
        tm.filter_eval_shape(lambda m: m(**_inputs()), model)  # inference: as transformers


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_matches_peft(tmp_path: Path) -> None:
    hf, model = _pair(WhisperForConditionalGeneration)
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=2, alpha=4, key=jax.random.key(3))
    state = tm.state_dict(tuned)
    names = [n for n in state if n.endswith("lora_B.weight")]
    assert len(names) == 2 * (2 + 2 * 2)  # encoder self, decoder self and cross attentions
    rng = np.random.default_rng(2)
    state.update({n: 0.3 * rng.standard_normal(state[n].shape, np.float32) for n in names})
    tuned = tm.load_state_dict(tuned, state)
    lora.save_adapter(tuned, tmp_path)
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    inputs = _inputs()
    want = _hf_out(reference, inputs)
    assert relative_error(run(tuned, inputs), want) <= RTOL
    assert relative_error(run(model, inputs), want) > 1e-3


def test_generate_equals_transformers_greedy_from_a_prompt() -> None:
    hf, model = _pair(WhisperForConditionalGeneration)
    with torch.no_grad():  # wide weights spread the logits away from ties
        for p in hf.parameters():
            p.add_(0.5 * torch.randn_like(p))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    state.pop("proj_out.weight")
    model = tm.load_state_dict(model, state)
    features = _inputs(batch=3)["input_features"]
    prompt = np.array([[1, 5, 6]])  # start, then e.g. language and task tokens

    def hf_generate(**kwargs: Any) -> np.ndarray:
        with torch.no_grad():  # transformers' plain greedy decoding (not Whisper's options)
            return GenerationMixin.generate(
                hf,
                input_features=torch.from_numpy(features),
                decoder_input_ids=torch.from_numpy(np.repeat(prompt, 3, 0)),
                do_sample=False,
                max_new_tokens=12,
                **kwargs,
            ).numpy()

    plain = hf_generate(eos_token_id=None, pad_token_id=0)
    got = generate_seq2seq(
        model, input_features=features, decoder_input_ids=prompt, max_new_tokens=12
    )
    np.testing.assert_array_equal(np.asarray(got), plain)
    eos = int(plain[0, 5])
    want = hf_generate(eos_token_id=eos, pad_token_id=0)
    got = generate_seq2seq(
        model, input_features=features, decoder_input_ids=prompt, max_new_tokens=12,
        eos_token_id=eos, pad_token_id=0,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got), want)
    # Suppressed tokens, and tokens suppressed first, as transformers' processors.
    suppress, begin = [int(plain[0, 4])], [int(plain[1, 3]), int(plain[2, 3])]
    want = hf_generate(eos_token_id=None, suppress_tokens=suppress, begin_suppress_tokens=begin)
    got = generate_seq2seq(
        model, input_features=features, decoder_input_ids=prompt, max_new_tokens=12,
        suppress_tokens=suppress, begin_suppress_tokens=begin,
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(got), want)
    assert not np.array_equal(want, plain)
    # Without a prompt: the config's decoder_start_token_id.
    alone = generate_seq2seq(model, input_features=features, max_new_tokens=2)
    assert alone.shape == (3, 3) and (np.asarray(alone)[:, 0] == 1).all()
    with pytest.raises(ValueError, match="max_target_positions=30"):
        generate_seq2seq(
            model, input_features=features, decoder_input_ids=prompt, max_new_tokens=28
        )
    with pytest.raises(ValueError, match="does not take input_ids"):
        generate_seq2seq(model, np.ones((3, 4), int), max_new_tokens=2)


def test_log_mel_features_equal_the_feature_extractor() -> None:
    extractor = T.WhisperFeatureExtractor(feature_size=80)
    np.testing.assert_allclose(mel_filters(80, 400, 16000), extractor.mel_filters, atol=1e-15)
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 2) / 16000
    short = (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    long = (0.1 * rng.standard_normal(16000 * 31)).astype(np.float32)  # cut to 30 s
    got = log_mel_features(np.stack([short, long[: short.size]]))
    for row, audio in enumerate((short, long)):
        padded = np.pad(audio[: 16000 * 30], (0, max(0, 16000 * 30 - audio.size)))
        want = extractor._np_extract_fbank_features(padded[None], "cpu")
        np.testing.assert_allclose(np.asarray(log_mel_features(audio)), want, atol=2e-5)
        if row == 0:
            np.testing.assert_allclose(np.asarray(got[:1]), want, atol=2e-5)
    assert got.shape == (2, 80, 3000)
    with pytest.raises(ValueError, match="`hop_length` must be a positive int"):
        log_mel_features(short, hop_length=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_audio_classification_both_ways(weighted: bool, tmp_path: Path) -> None:
    config = {
        **BASE,
        "num_labels": 3,
        "classifier_proj_size": 6,
        "use_weighted_layer_sum": weighted,
    }
    torch.manual_seed(0)
    hf = T.WhisperForAudioClassification(T.WhisperConfig(**config))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias") or name == "layer_weights":
                p.add_(0.1 * torch.randn_like(p))
    hf.eval()
    inputs = {"input_features": _inputs()["input_features"]}
    want = _hf_out(hf, inputs)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is WhisperForAudioClassification
    assert relative_error(run(model, inputs), want) <= RTOL
    save_pretrained(model, tmp_path / "tm")
    back, info = type(hf).from_pretrained(tmp_path / "tm", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert relative_error(_hf_out(back.eval(), inputs), want) <= RTOL


def test_adapters_name_no_peft_task_type(tmp_path: Path) -> None:
    # PEFT's SEQ_2_SEQ_LM wrapper passes input_ids, which Whisper's forward does not take.
    import json

    _, model = _pair(WhisperForConditionalGeneration)
    tuned = lora.add_lora(model, ["q_proj"], r=2, alpha=4, key=jax.random.key(0))
    lora.save_adapter(tuned, tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["task_type"] is None
