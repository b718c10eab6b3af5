"""Every RoPE type Llama's rotary embedding supports in `transformers` 5, against `transformers`:
each type and its optional parameters, the old `rope_scaling` spelling and the new
`rope_parameters`, top-level `rope_theta`, and the types that depend on the call's length
(dynamic NTK grows past `max_position_embeddings`; longrope switches factor sets past
`original_max_position_embeddings`) on both sides of their threshold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers as T
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import RTOL, hf_output, padded_batch, pair, relative_error, run

from treemod.models.llama import LlamaForCausalLM

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8,
}
# head_dim 8: 4 frequencies.
ROPES: dict[str, dict[str, Any]] = {
    "default-theta": {"rope_theta": 500.0},
    "default-partial-ignored": {"rope_parameters": {"partial_rotary_factor": 0.5}},
    "linear": {"rope_scaling": {"type": "linear", "factor": 2.0}},
    "dynamic": {"rope_scaling": {"rope_type": "dynamic", "factor": 3.0}},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
    "yarn-options": {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 8,
            "beta_slow": 2,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "truncate": False,
        }
    },
    "yarn-attention-factor": {
        "rope_scaling": {"type": "yarn", "factor": 2.0, "attention_factor": 0.8}
    },
    "longrope": {
        "rope_parameters": {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.2, 1.5, 2.0],
            "long_factor": [2.0, 3.0, 4.0, 6.0],
            "original_max_position_embeddings": 6,
        }
    },
    "longrope-factor": {
        "rope_parameters": {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [1.5, 2.0, 2.5, 3.0],
            "factor": 3.0,
            "attention_factor": 1.2,
            "original_max_position_embeddings": 6,
        }
    },
    "llama3": {
        "rope_theta": 50.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 4,
        },
    },
    "proportional": {
        "rope_parameters": {
            "rope_type": "proportional",
            "rope_theta": 100.0,
            "partial_rotary_factor": 0.5,
            "factor": 2.0,
        }
    },
}


def _pair(config: dict[str, Any]) -> tuple[Any, Any]:
    return pair(T.LlamaForCausalLM, T.LlamaConfig, LlamaForCausalLM, config, "eager")


def _check(config: dict[str, Any], seqs: tuple[int, ...] = (5, 11)) -> None:
    hf, model = _pair(config)
    # Lengths in increasing order: transformers' dynamic RoPE keeps the longest length it has
    # seen (a model called with a longer input first computes differently afterwards), and
    # treemod's computes what a freshly built transformers model does.
    for seq in seqs:
        ids, mask = padded_batch(100, batch=2, seq=seq)
        inputs = {"input_ids": ids, "attention_mask": mask}
        assert relative_error(run(model, inputs), hf_output(hf, **inputs)) <= RTOL, seq


@pytest.mark.parametrize("name", list(ROPES))
def test_rope_type_matches_transformers(name: str) -> None:
    # Inputs of 5 and 11 tokens: below and above max_position_embeddings (8) and the longrope
    # threshold (6).
    _check({**BASE, **ROPES[name]})


def test_explicit_positions_past_the_threshold() -> None:
    # The call's longest position, not its length, decides dynamic and longrope tables.
    for name in ("dynamic", "longrope"):
        config = {**BASE, **ROPES[name]}
        hf, model = _pair(config)
        ids, _ = padded_batch(100, batch=2, seq=4)
        positions = np.array([[9, 10, 11, 12], [0, 1, 2, 3]])
        inputs = {"input_ids": ids, "position_ids": positions}
        assert relative_error(run(model, inputs), hf_output(hf, **inputs)) <= RTOL, name


@settings(max_examples=5)
@given(
    kind=st.sampled_from(["linear", "dynamic", "yarn", "llama3"]),
    factor=st.sampled_from([1.0, 1.5, 4.0]),
    theta=st.sampled_from([10.0, 10000.0]),
    original=st.sampled_from([2, 4, 6]),
)
def test_rope_parameters_match_transformers(
    kind: str, factor: float, theta: float, original: int
) -> None:
    params: dict[str, Any] = {"rope_type": kind, "factor": factor, "rope_theta": theta}
    if kind in ("yarn", "llama3"):
        params["original_max_position_embeddings"] = original
    if kind == "llama3":
        params |= {"low_freq_factor": 1.0, "high_freq_factor": 3.0}
    _check({**BASE, "rope_parameters": params}, seqs=(9,))
