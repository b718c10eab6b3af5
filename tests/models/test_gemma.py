"""Gemma, Gemma 2 and Gemma 3 (text) against `transformers`' own: `(1 + weight)` norms, scaled
embeddings, Gemma 2's four norms and soft-capping, sliding-window layer types, Gemma 3's q/k
norms and local RoPE; padded batches, a hypothesis test per family, directories both ways,
LoRA against PEFT, and the refused config values named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import pair
from lm_variant_checks import (
    PEFT_WARNING,
    check_bfloat16,
    check_directories,
    check_lora,
    check_padded_batch,
    refused,
)

from treemod.models.gemma import (
    Gemma2ForCausalLM,
    Gemma2Model,
    Gemma3ForCausalLM,
    Gemma3TextModel,
    GemmaForCausalLM,
    GemmaModel,
)

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

T = transformers
BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}
HF = {
    GemmaModel: (T.GemmaModel, T.GemmaConfig),
    GemmaForCausalLM: (T.GemmaForCausalLM, T.GemmaConfig),
    Gemma2Model: (T.Gemma2Model, T.Gemma2Config),
    Gemma2ForCausalLM: (T.Gemma2ForCausalLM, T.Gemma2Config),
    Gemma3TextModel: (T.Gemma3TextModel, T.Gemma3TextConfig),
    Gemma3ForCausalLM: (T.Gemma3ForCausalLM, T.Gemma3TextConfig),
}


def _pair(cls: Any, config: dict[str, Any]) -> tuple[Any, Any]:
    return pair(*HF[cls], cls, {**BASE, **config}, "eager")


@pytest.mark.parametrize(
    "cls, extra",
    [
        (GemmaModel, {}),
        (GemmaForCausalLM, {"attention_bias": True, "hidden_act": "gelu"}),
        (GemmaForCausalLM, {"tie_word_embeddings": False}),
        (Gemma2Model, {"sliding_window": 3, "query_pre_attn_scalar": 10}),
        # Soft-capping that acts: caps near the scores' and logits' size.
        (
            Gemma2ForCausalLM,
            {"sliding_window": 2, "attn_logit_softcapping": 0.5, "final_logit_softcapping": 0.3},
        ),
        (
            Gemma2ForCausalLM,
            {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 3},
        ),
        (Gemma3TextModel, {"sliding_window": 3, "rope_local_base_freq": 100.0}),
        (
            Gemma3ForCausalLM,
            {
                "num_hidden_layers": 3,
                "sliding_window": 2,
                "sliding_window_pattern": 2,
                "rope_scaling": {"rope_type": "linear", "factor": 4.0},
                "final_logit_softcapping": 0.5,
            },
        ),
        (
            Gemma3ForCausalLM,
            {
                "sliding_window": 3,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 50.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                },
                "layer_types": ["full_attention", "sliding_attention"],
            },
        ),
    ],
)
def test_padded_batch_matches_transformers(cls: Any, extra: dict[str, Any]) -> None:
    hf, model = _pair(cls, extra)
    check_padded_batch(hf, model, 100)


@settings(max_examples=2, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("cls", [GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM])
def test_config_values_match_transformers(cls: Any, data: Any) -> None:
    heads, kv_heads = data.draw(st.sampled_from([(2, 1), (4, 2), (4, 4)]))
    config: dict[str, Any] = {
        "vocab_size": 60,
        "intermediate_size": data.draw(st.sampled_from([16, 40])),
        "num_hidden_layers": data.draw(st.integers(1, 3)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": data.draw(st.sampled_from([4, 12])),
        "rms_norm_eps": data.draw(st.sampled_from([1e-6, 1e-3])),
        "attention_bias": data.draw(st.booleans()),
        "tie_word_embeddings": data.draw(st.booleans()),
        "rope_theta": data.draw(st.sampled_from([100.0, 10000.0])),
    }
    act = data.draw(st.sampled_from(["gelu_pytorch_tanh", "gelu", "silu"]))
    if cls is GemmaForCausalLM:
        config["hidden_act"] = act
    else:
        config["hidden_activation"] = act
        config["sliding_window"] = data.draw(st.sampled_from([2, 5]))
        config["query_pre_attn_scalar"] = data.draw(st.sampled_from([8, 30]))
        config["attn_logit_softcapping"] = data.draw(st.sampled_from([None, 1.0]))
        config["final_logit_softcapping"] = data.draw(st.sampled_from([None, 1.0]))
    if cls is Gemma3ForCausalLM:
        config["rope_local_base_freq"] = data.draw(st.sampled_from([100.0, 10000.0]))
        config["sliding_window_pattern"] = data.draw(st.integers(1, 3))
    hf, model = _pair(cls, config)
    check_padded_batch(hf, model, 60, seq=6)


@pytest.mark.parametrize("cls", [GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM])
def test_directories_both_ways(cls: Any, tmp_path: Path) -> None:
    hf, _ = _pair(cls, {"sliding_window": 3} if cls is not GemmaForCausalLM else {})
    check_directories(hf, tmp_path, 100)


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_lora_equals_peft(tmp_path: Path) -> None:
    hf, model = _pair(Gemma3ForCausalLM, {"sliding_window": 3})
    check_lora(hf, model, ["q_proj", "o_proj", "up_proj"], tmp_path, 100)


def test_embedding_scale_is_rounded_to_the_model_dtype() -> None:
    # sqrt(3072) = 55.43 is 55.5 in bfloat16, as transformers multiplies.
    config = {**BASE, "hidden_size": 3072, "num_hidden_layers": 1}
    skeleton = GemmaModel.from_config(
        {**config, "intermediate_size": 8}, key=jax.random.key(0), dtype=jnp.bfloat16
    )
    ids = np.array([[3]])
    got = skeleton.embed(jnp.asarray(ids))
    weight = torch.tensor(np.asarray(skeleton.embed_tokens.weight.astype(jnp.float32)))
    rows = torch.nn.functional.embedding(torch.from_numpy(ids), weight.bfloat16())
    want = rows * torch.tensor(3072**0.5).to(torch.bfloat16)
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), want.float().numpy())


@pytest.mark.parametrize(
    "cls, change, key",
    [
        (GemmaModel, {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (GemmaForCausalLM, {"hidden_act": "prelu"}, "hidden_act"),
        (Gemma2ForCausalLM, {"hidden_activation": "xielu"}, "hidden_activation"),
        (Gemma2Model, {"sliding_window": None}, "sliding_window"),
        (Gemma2Model, {"layer_types": ["full_attention"]}, "layer_types"),
        (Gemma2ForCausalLM, {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar"),
        (Gemma2ForCausalLM, {"final_logit_softcapping": -1.0}, "final_logit_softcapping"),
        (Gemma3ForCausalLM, {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            Gemma3ForCausalLM,
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}},
            "rope_parameters",
        ),
        (
            Gemma3TextModel,
            {"rope_scaling": {"rope_type": "mrope"}},
            "rope_parameters.rope_type",
        ),
    ],
)
def test_refused_config_values_are_named(cls: Any, change: dict[str, Any], key: str) -> None:
    refused(cls, {**BASE, **change}, key)


@pytest.mark.parametrize("cls", [GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM])
def test_bfloat16(cls: Any) -> None:
    check_bfloat16(cls, {**BASE, "sliding_window": 3, "final_logit_softcapping": 5.0})
