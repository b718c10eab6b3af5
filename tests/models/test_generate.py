"""`treemod.models.generate` against `transformers`' `generate(do_sample=False)`.

Each model is a `transformers` model from a tiny random config and treemod's twin with its
weights (`lm_reference.pair`). Greedy tokens must be identical, for a batch of prompts of
different lengths (left padding), with end-of-sequence ids that finish rows at different steps
(later tokens padded) and all rows early (the output is shorter), with sliding windows and a
scaled RoPE; the whole 64-token generation must trace once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import transformers
from lm_reference import pair
from lm_variant_checks import pair_through_files

import treemod.models._generate as generation
from treemod.models import (
    GPT2LMHeadModel,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    generate,
)
from treemod.models.gemma import Gemma2ForCausalLM, Gemma3ForCausalLM, GemmaForCausalLM
from treemod.models.llama_variants import Qwen3ForCausalLM
from treemod.models.mixtral import MixtralForCausalLM
from treemod.models.phi3 import Phi3ForCausalLM

# A wide initialisation spreads the logits, so greedy choices are far from ties.
_LLAMA = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "initializer_range": 0.2,
    "max_position_embeddings": 64,
}
_GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100, "initializer_range": 0.2}
CASES: dict[str, tuple[Any, Any, Any, dict[str, Any]]] = {
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, GPT2LMHeadModel, _GPT2),
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, LlamaForCausalLM, _LLAMA),
    # A window of 4 is shorter than the prompts plus the new tokens: it masks old positions.
    "mistral": (
        transformers.MistralForCausalLM,
        transformers.MistralConfig,
        MistralForCausalLM,
        {**_LLAMA, "sliding_window": 4},
    ),
    # Layer 0 full attention, layer 1 a sliding window; tied head.
    "qwen2": (
        transformers.Qwen2ForCausalLM,
        transformers.Qwen2Config,
        Qwen2ForCausalLM,
        {
            **_LLAMA,
            "use_sliding_window": True,
            "sliding_window": 3,
            "max_window_layers": 1,
            "tie_word_embeddings": True,
        },
    ),
    # q/k norms; layer 1 a sliding window.
    "qwen3": (
        transformers.Qwen3ForCausalLM,
        transformers.Qwen3Config,
        Qwen3ForCausalLM,
        {
            **_LLAMA,
            "head_dim": 8,
            "use_sliding_window": True,
            "sliding_window": 3,
            "max_window_layers": 1,
        },
    ),
    # Scaled embeddings, (1 + weight) norms, tied head.
    "gemma": (
        transformers.GemmaForCausalLM,
        transformers.GemmaConfig,
        GemmaForCausalLM,
        {**_LLAMA, "head_dim": 8},
    ),
    # Soft-capped scores and logits; layer 0 a sliding window of 3.
    "gemma2": (
        transformers.Gemma2ForCausalLM,
        transformers.Gemma2Config,
        Gemma2ForCausalLM,
        {
            **_LLAMA,
            "head_dim": 8,
            "sliding_window": 3,
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
    ),
    # q/k norms; the sliding layer's own RoPE base, the full layer's RoPE scaled.
    "gemma3": (
        transformers.Gemma3ForCausalLM,
        transformers.Gemma3TextConfig,
        Gemma3ForCausalLM,
        {
            **_LLAMA,
            "head_dim": 8,
            "sliding_window": 3,
            "sliding_window_pattern": 2,
            "rope_local_base_freq": 100.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    # Fused projections, a partial longrope (prompts and new tokens within the short factors).
    "phi3": (
        transformers.Phi3ForCausalLM,
        transformers.Phi3Config,
        Phi3ForCausalLM,
        {
            **_LLAMA,
            "pad_token_id": 0,
            "partial_rotary_factor": 0.5,
            "max_position_embeddings": 128,
            "original_max_position_embeddings": 64,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.5],
                "long_factor": [2.0, 5.0],
            },
        },
    ),
    # Two of four experts per token; its files' per-expert layout (moved through files).
    "mixtral": (
        transformers.MixtralForCausalLM,
        transformers.MixtralConfig,
        MixtralForCausalLM,
        {**_LLAMA, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "llama-rope-llama3": (
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig,
        LlamaForCausalLM,
        {
            **_LLAMA,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
}


def prompts(batch_lengths: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded random prompts of the given lengths: `(ids, attention_mask)`."""
    rng = np.random.default_rng(seed)
    width = max(batch_lengths)
    ids = rng.integers(1, 100, (len(batch_lengths), width))
    mask = np.zeros_like(ids)
    for row, n in enumerate(batch_lengths):
        mask[row, width - n :] = 1
    return np.where(mask == 1, ids, 0), mask


def hf_generate(hf: Any, ids: np.ndarray, mask: np.ndarray, **kwargs: Any) -> np.ndarray:
    with torch.no_grad():
        out = hf.generate(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            do_sample=False,
            **kwargs,
        )
    return out.numpy()


def _finishing_rows_apart(new_tokens: np.ndarray) -> int:
    """A token that some row generates before the last step and the rows reach at different
    steps (or not at all)."""
    last = new_tokens.shape[1]
    for token in dict.fromkeys(new_tokens[:, :-1].ravel().tolist()):
        first = [
            int(np.argmax(row == token)) if (row == token).any() else last for row in new_tokens
        ]
        if len(set(first)) > 1:
            return int(token)
    raise AssertionError(f"no token finishes the rows at different steps in {new_tokens}")


def _never_generated(tokens: np.ndarray) -> int:
    return next(t for t in range(98, 0, -1) if not (tokens == t).any())


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_equals_transformers_with_padding_and_eos(name: str, tmp_path: Any) -> None:
    hf_cls, config_cls, tm_cls, config = CASES[name]
    attn = "eager" if name == "gemma2" else "sdpa"  # transformers' Gemma 2 has no SDPA
    if name == "mixtral":
        hf, model = pair_through_files(hf_cls, config_cls, config, tmp_path, attn)
    else:
        hf, model = pair(hf_cls, config_cls, tm_cls, config, attn)
    ids, mask = prompts((2, 5, 7))
    new = 10
    plain = hf_generate(hf, ids, mask, max_new_tokens=new, eos_token_id=None, pad_token_id=0)
    # End-of-sequence ids: a generated token that rows reach first at different steps, one of
    # them before the last, so the rows that finish early are padded with 99 (which token does
    # depends on the random model); and a token never generated, so several ids are given.
    eos = [_finishing_rows_apart(plain[:, 7:]), _never_generated(plain)]
    want = hf_generate(hf, ids, mask, max_new_tokens=new, eos_token_id=eos, pad_token_id=99)
    got = generate(
        model, ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, pad_token_id=99
    )
    np.testing.assert_array_equal(np.asarray(got), want)
    assert (want == 99).any(), "the case should pad a finished row"


def test_all_rows_finished_stops_early_and_defaults_pad_to_eos() -> None:
    hf, model = pair(*CASES["llama"][:3], CASES["llama"][3])
    ids, mask = prompts((3, 6), seed=1)
    plain = hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=None, pad_token_id=0)
    eos = sorted({int(plain[0, 6 + 1]), int(plain[1, 6 + 3])})  # every row done by step 3
    want = hf_generate(hf, ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=eos[0])
    got = generate(model, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos)
    assert want.shape[1] < 6 + 12
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_64_token_generation_traces_once_and_decodes_with_one_step_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hf, model = pair(*CASES["gpt2"][:3], CASES["gpt2"][3])
    forward_traces: list[int] = []
    original = generation.cached_logits

    def counting(*args: Any) -> Any:
        forward_traces.append(args[1].shape[1])  # the number of new tokens it is traced for
        return original(*args)

    monkeypatch.setattr(generation, "cached_logits", counting)
    run = generation._run.with_max_traces(None)  # its own trace count, starting at zero
    monkeypatch.setattr(generation, "_run", run)
    ids = np.array([[5, 17, 3, 42, 8, 11, 29]])
    got = generate(model, ids, max_new_tokens=64)
    again = generate(model, ids[:, ::-1].copy(), max_new_tokens=64)  # same shapes: no trace
    assert run.num_traces == 1
    assert forward_traces == [7, 1]  # the prefill once, the decoding step once (not per token)
    want = hf_generate(hf, ids, np.ones_like(ids), max_new_tokens=64, pad_token_id=0)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert again.shape == (1, 7 + 64)
