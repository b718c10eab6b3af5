"""Phi-3 (`Phi3Model`, `Phi3ForCausalLM`) against `transformers`' own: fused `qkv_proj` and
`gate_up_proj`, partial rotary, longrope's short and long factors, sliding windows; padded
batches, a hypothesis test over the config values, directories both ways, LoRA on the fused
projections against PEFT, and refusals named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
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

from treemod.models import generate
from treemod.models.phi3 import Phi3ForCausalLM, Phi3Model

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
    "pad_token_id": 0,
    "max_position_embeddings": 16,
    "original_max_position_embeddings": 16,
}
HF = {Phi3Model: T.Phi3Model, Phi3ForCausalLM: T.Phi3ForCausalLM}


def _longrope(original: int) -> dict[str, Any]:
    # head_dim 8, partial 0.5: 4 rotary features, 2 factors each.
    return {
        "partial_rotary_factor": 0.5,
        "original_max_position_embeddings": original,
        "max_position_embeddings": 32,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 5.0]},
    }


@pytest.mark.parametrize(
    "cls, extra",
    [
        (Phi3Model, {}),
        (Phi3ForCausalLM, {"partial_rotary_factor": 0.5, "tie_word_embeddings": True}),
        (Phi3ForCausalLM, {"sliding_window": 3, "num_key_value_heads": 4}),
        (Phi3ForCausalLM, _longrope(4)),  # seq 7 > 4: the long factors
        (Phi3ForCausalLM, _longrope(8)),  # the short ones
    ],
)
def test_padded_batch_matches_transformers(cls: Any, extra: dict[str, Any]) -> None:
    hf, model = pair(HF[cls], T.Phi3Config, cls, {**BASE, **extra}, "eager")
    check_padded_batch(hf, model, 100)


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_config_values_match_transformers(data: Any) -> None:
    heads, kv_heads = data.draw(st.sampled_from([(2, 1), (4, 2), (4, 4)]))
    config = {
        **BASE,
        "vocab_size": 60,
        "intermediate_size": data.draw(st.sampled_from([16, 40])),
        "num_hidden_layers": data.draw(st.integers(1, 2)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": data.draw(st.sampled_from(["silu", "gelu_new"])),
        "rms_norm_eps": data.draw(st.sampled_from([1e-5, 1e-3])),
        "tie_word_embeddings": data.draw(st.booleans()),
        "sliding_window": data.draw(st.sampled_from([None, 2])),
        "partial_rotary_factor": data.draw(st.sampled_from([0.5, 1.0])),
        "rope_theta": data.draw(st.sampled_from([100.0, 10000.0])),
    }
    hf, model = pair(T.Phi3ForCausalLM, T.Phi3Config, Phi3ForCausalLM, config, "eager")
    check_padded_batch(hf, model, 60, seq=6)


def test_directories_both_ways(tmp_path: Path) -> None:
    hf, _ = pair(T.Phi3ForCausalLM, T.Phi3Config, Phi3ForCausalLM, {**BASE, **_longrope(4)})
    check_directories(hf, tmp_path, 100)


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_lora_on_fused_projections_equals_peft(tmp_path: Path) -> None:
    hf, model = pair(T.Phi3ForCausalLM, T.Phi3Config, Phi3ForCausalLM, BASE, "eager")
    check_lora(hf, model, ["qkv_proj", "gate_up_proj"], tmp_path, 100)


def test_generate_stops_where_longrope_would_switch_factors() -> None:
    # transformers recomputes the sequence with the long factors when it passes
    # original_max_position_embeddings; a cache of short-factor keys cannot, so it is refused.
    _, model = pair(T.Phi3ForCausalLM, T.Phi3Config, Phi3ForCausalLM, {**BASE, **_longrope(8)})
    ids = np.array([[5, 6, 7]])
    assert generate(model, ids, max_new_tokens=5).shape == (1, 8)
    with pytest.raises(ValueError, match="original_max_position_embeddings=8"):
        generate(model, ids, max_new_tokens=6)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling.rope_type"),
        ({"rope_scaling": {"type": "su", "short_factor": [1.0] * 4}}, "rope_scaling.rope_type"),
        ({"resid_pdrop": 0.1}, "resid_pdrop"),
        ({"embd_pdrop": 0.1}, "embd_pdrop"),
        ({"sliding_window": 0}, "sliding_window"),
        (
            {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
            "rope_parameters.short_factor",
        ),
        ({"partial_rotary_factor": 0.1}, "rope_parameters.partial_rotary_factor"),
    ],
)
def test_refused_config_values_are_named(change: dict[str, Any], key: str) -> None:
    refused(Phi3ForCausalLM, {**BASE, **change}, key)


def test_bfloat16() -> None:
    check_bfloat16(Phi3ForCausalLM, {**BASE, **_longrope(4)})
