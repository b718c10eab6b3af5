"""Qwen3 (`Qwen3Model`, `Qwen3ForCausalLM`) against `transformers`' own: q/k norms per head,
`attention_bias` on all four projections, sliding-window layer types, padded batches, a
hypothesis test over the config values, directories both ways, LoRA against PEFT, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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

from treemod.models.llama_variants import Qwen3ForCausalLM, Qwen3Model

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
HF = {Qwen3Model: T.Qwen3Model, Qwen3ForCausalLM: T.Qwen3ForCausalLM}


@pytest.mark.parametrize(
    "cls, extra",
    [
        (Qwen3Model, {}),
        (Qwen3ForCausalLM, {"attention_bias": True, "tie_word_embeddings": True}),
        (
            Qwen3ForCausalLM,
            {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1},
        ),
        (
            Qwen3ForCausalLM,
            {
                "use_sliding_window": True,
                "sliding_window": 2,
                "layer_types": ["sliding_attention", "full_attention"],
            },
        ),
    ],
)
def test_padded_batch_matches_transformers(cls: Any, extra: dict[str, Any]) -> None:
    hf, model = pair(HF[cls], T.Qwen3Config, cls, {**BASE, **extra}, "eager")
    body = model if cls is Qwen3Model else model.model
    assert body.layers.layers.self_attn.q_norm.weight.shape == (2, 8)
    check_padded_batch(hf, model, 100)


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_config_values_match_transformers(data: Any) -> None:
    heads, kv_heads = data.draw(st.sampled_from([(2, 1), (4, 2), (4, 4)]))
    config = {
        "vocab_size": 60,
        "hidden_size": 32,
        "intermediate_size": data.draw(st.sampled_from([16, 40])),
        "num_hidden_layers": data.draw(st.integers(1, 2)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": data.draw(st.sampled_from([4, 12])),
        "hidden_act": data.draw(st.sampled_from(["silu", "gelu"])),
        "rms_norm_eps": data.draw(st.sampled_from([1e-6, 1e-3])),
        "attention_bias": data.draw(st.booleans()),
        "tie_word_embeddings": data.draw(st.booleans()),
        "use_sliding_window": data.draw(st.booleans()),
        "sliding_window": data.draw(st.sampled_from([2, 5])),
        "max_window_layers": data.draw(st.integers(0, 2)),
        "rope_theta": data.draw(st.sampled_from([100.0, 10000.0])),
    }
    hf, model = pair(T.Qwen3ForCausalLM, T.Qwen3Config, Qwen3ForCausalLM, config, "eager")
    check_padded_batch(hf, model, 60, seq=6)


def test_directories_both_ways(tmp_path: Path) -> None:
    hf, _ = pair(T.Qwen3ForCausalLM, T.Qwen3Config, Qwen3ForCausalLM, BASE)
    check_directories(hf, tmp_path, 100)


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_lora_equals_peft(tmp_path: Path) -> None:
    hf, model = pair(T.Qwen3ForCausalLM, T.Qwen3Config, Qwen3ForCausalLM, BASE, "eager")
    check_lora(hf, model, ["q_proj", "v_proj", "down_proj"], tmp_path, 100)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types[1]"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "sliding_window"),
        ({"head_dim": 7}, "head_dim"),
        ({"hidden_act": "prelu"}, "hidden_act"),
    ],
)
def test_refused_config_values_are_named(change: dict[str, Any], key: str) -> None:
    refused(Qwen3ForCausalLM, {**BASE, **change}, key)


def test_bfloat16() -> None:
    check_bfloat16(Qwen3ForCausalLM, BASE)
