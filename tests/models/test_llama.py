"""The Llama family (Llama, Mistral, Qwen2; base and causal-LM classes) against `transformers`'
own, weights moved with `tm.load_state_dict`: float32 outputs within 1e-5 relative, padded
batches, sliding windows, packed positions, a hypothesis test over each family's config values,
and the refused values named in the error. RoPE types: `test_llama_rope.py`."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import RTOL, hf_output, padded_batch, pair, relative_error, run

import treemod as tm
from treemod.models.llama import LlamaForCausalLM, LlamaModel
from treemod.models.llama_variants import (
    MistralForCausalLM,
    MistralModel,
    Qwen2ForCausalLM,
    Qwen2Model,
)

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
T = transformers
HF = {
    LlamaModel: (T.LlamaModel, T.LlamaConfig),
    LlamaForCausalLM: (T.LlamaForCausalLM, T.LlamaConfig),
    MistralModel: (T.MistralModel, T.MistralConfig),
    MistralForCausalLM: (T.MistralForCausalLM, T.MistralConfig),
    Qwen2Model: (T.Qwen2Model, T.Qwen2Config),
    Qwen2ForCausalLM: (T.Qwen2ForCausalLM, T.Qwen2Config),
}


def _pair(cls: Any, config: dict[str, Any], attn: str = "sdpa") -> tuple[Any, Any]:
    hf_cls, config_cls = HF[cls]
    return pair(hf_cls, config_cls, cls, config, attn)


@pytest.mark.parametrize("cls", list(HF), ids=lambda c: c.__name__)
def test_padded_batch_matches_transformers(cls: Any) -> None:
    # transformers' default (SDPA) attention; its padded positions depend on the attention
    # implementation, so only the tokens are compared. Mistral: a window shorter than the input.
    config = {**BASE, "sliding_window": 4} if "Mistral" in cls.__name__ else BASE
    hf, model = _pair(cls, config)
    ids, mask = padded_batch(100)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    got = run(model, {"input_ids": ids, "attention_mask": mask})
    assert relative_error(got, want, keep=mask) <= RTOL


def test_padded_positions_match_eager_attention() -> None:
    hf, model = _pair(LlamaForCausalLM, BASE, attn="eager")
    ids, mask = padded_batch(100)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    assert relative_error(run(model, {"input_ids": ids, "attention_mask": mask}), want) <= RTOL
    # Masks of any dtype: nonzero is a token, as transformers reads them.
    for dtype in (bool, np.float32):
        got = run(model, {"input_ids": ids, "attention_mask": mask.astype(dtype)})
        assert relative_error(got, want) <= RTOL, dtype
    # Eagerly too, without a mask.
    assert relative_error(model(input_ids=ids), hf_output(hf, input_ids=ids)) <= RTOL


@pytest.mark.parametrize("use_cache", [True, False])
def test_explicit_positions(use_cache: bool) -> None:
    # transformers reads packed sequences from jumps in the positions only without a cache,
    # which its forward creates when the config's use_cache is on.
    config = {**BASE, "sliding_window": 3, "use_cache": use_cache}
    hf, model = _pair(MistralForCausalLM, config, attn="eager")
    ids, _ = padded_batch(100, batch=2, seq=8)
    positions = np.array([[0, 1, 2, 3, 0, 1, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10]])
    inputs = {"input_ids": ids, "position_ids": positions}
    assert relative_error(run(model, inputs), hf_output(hf, **inputs)) <= RTOL
    shared = {"input_ids": ids, "position_ids": positions[1:]}  # (1, seq), broadcast
    assert relative_error(run(model, shared), hf_output(hf, **shared)) <= RTOL


def test_qwen2_sliding_layers() -> None:
    # Windows on the layers from max_window_layers on, or on those layer_types names.
    ids, mask = padded_batch(100, seq=8)
    for extra in (
        {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        {
            "use_sliding_window": True,
            "sliding_window": 2,
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        },
        {"use_sliding_window": False, "sliding_window": 2},
    ):
        hf, model = _pair(Qwen2ForCausalLM, {**BASE, **extra}, attn="eager")
        want = hf_output(hf, input_ids=ids, attention_mask=mask)
        got = run(model, {"input_ids": ids, "attention_mask": mask})
        assert relative_error(got, want) <= RTOL, extra


def _family_config(draw: Any, family: str) -> dict[str, Any]:
    heads, kv_heads = draw(st.sampled_from([(1, 1), (2, 1), (4, 2), (4, 4), (6, 2)]))
    head_dim = draw(st.sampled_from([None, 4, 12]))
    # With head_dim set, hidden_size still has to be a multiple of the head count (transformers
    # validates it); 36 is one for every count drawn and never heads * head_dim.
    hidden = heads * draw(st.sampled_from([2, 4])) if head_dim is None else 36
    config: dict[str, Any] = {
        "vocab_size": 60,
        "hidden_size": hidden,
        "intermediate_size": draw(st.sampled_from([16, 40])),
        "num_hidden_layers": draw(st.integers(1, 2)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": draw(st.sampled_from(["silu", "gelu", "gelu_pytorch_tanh", "relu"])),
        "rms_norm_eps": draw(st.sampled_from([1e-6, 1e-3])),
        "tie_word_embeddings": draw(st.booleans()),
        "rope_theta": draw(st.sampled_from([100.0, 10000.0])),
        "max_position_embeddings": 32,
    }
    if head_dim is not None:
        config["head_dim"] = head_dim
    if family == "llama":
        config["attention_bias"] = draw(st.booleans())
        config["mlp_bias"] = draw(st.booleans())
    elif family == "mistral":
        config["sliding_window"] = draw(st.sampled_from([None, 2, 5]))
    else:
        config["use_sliding_window"] = draw(st.booleans())
        config["sliding_window"] = draw(st.sampled_from([2, 5]))
        config["max_window_layers"] = draw(st.integers(0, 2))
    return config


@settings(max_examples=4)
@given(data=st.data())
@pytest.mark.parametrize("cls", [LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM])
def test_config_values_match_transformers(cls: Any, data: Any) -> None:
    config = _family_config(data.draw, cls.model_type)
    hf, model = _pair(cls, config, attn="eager")
    assert (model.lm_head is None) == config["tie_word_embeddings"]
    ids, mask = padded_batch(60, batch=2, seq=6)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    got = run(model, {"input_ids": ids, "attention_mask": mask})
    assert relative_error(got, want) <= RTOL


@pytest.mark.parametrize(
    "cls, change, key",
    [
        (LlamaModel, {"hidden_act": "prelu"}, "hidden_act"),
        (LlamaForCausalLM, {"num_key_value_heads": 3}, "num_key_value_heads"),
        (
            LlamaForCausalLM,
            {"num_attention_heads": 5, "num_key_value_heads": 5},
            "num_attention_heads",
        ),
        (LlamaForCausalLM, {"head_dim": 7}, "head_dim"),
        (LlamaForCausalLM, {"is_causal": False}, "is_causal"),
        (LlamaForCausalLM, {"rope_scaling": {"type": "mrope"}}, "rope_scaling.rope_type"),
        (
            LlamaForCausalLM,
            {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
            "rope_parameters",
        ),
        (
            LlamaForCausalLM,
            {"rope_parameters": {"rope_type": "linear", "partial_rotary_factor": 0.5}},
            "rope_parameters.partial_rotary_factor",
        ),
        (LlamaForCausalLM, {"rope_scaling": {"type": "linear"}}, "rope_parameters.factor"),
        (MistralModel, {"sliding_window": 0}, "sliding_window"),
        (
            Qwen2ForCausalLM,
            {"layer_types": ["full_attention", "sliding_attention"]},
            "sliding_window",
        ),
        (Qwen2Model, {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types[1]"),
        (Qwen2Model, {"layer_types": ["full_attention"]}, "layer_types"),
    ],
)
def test_refused_config_values_are_named(cls: Any, change: dict[str, Any], key: str) -> None:
    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config({**BASE, **change}, key=jax.random.key(0))
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}: config value {key}=")
    assert "not supported" in message


def test_names_skeleton_and_attention_dropout() -> None:
    # The state dict names are transformers' (the tied head an alias), from_config traces
    # under filter_eval_shape, and attention dropout acts in training mode only.
    config = {**BASE, "tie_word_embeddings": True, "attention_dropout": 0.5}
    model = LlamaForCausalLM.from_config(config, key=jax.random.key(0))
    hf = T.LlamaForCausalLM(T.LlamaConfig(**config))
    assert set(tm.state_dict(model)) == set(hf.state_dict()) - {"lm_head.weight"}
    assert model.tied_weights() == {"lm_head.weight": "model.embed_tokens.weight"}
    skeleton = tm.filter_eval_shape(
        lambda: Qwen2ForCausalLM.from_config(BASE, key=jax.random.key(0))
    )
    assert skeleton.model.layers.layers.self_attn.q_proj.bias.shape == (2, 32)
    assert skeleton.model.layers.layers.self_attn.o_proj.bias is None
    ids, _ = padded_batch(100, batch=2, seq=5)
    training = tm.nn.inference_mode(model, False)
    a = run(training, {"input_ids": ids, "key": jax.random.key(1)})
    b = run(model, {"input_ids": ids})
    assert not np.allclose(a, b)
