"""Speculative greedy decoding (`generate(..., assistant_model=draft)`): the model's own greedy
tokens, against `transformers`' plain greedy `generate`, whatever the draft proposes."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from lm_reference import pair
from test_generate import CASES, hf_generate

import treemod as tm
from treemod.models import GPT2LMHeadModel, LlamaForCausalLM, generate
from treemod.models._generation_config import GenerationSettings
from treemod.models._speculative import speculative_decode


@pytest.fixture(scope="module")
def llama() -> tuple[Any, Any]:
    return pair(*CASES["llama"][:3], CASES["llama"][3])


def _draft(config: dict[str, Any], seed: int) -> LlamaForCausalLM:
    small = {**config, "num_hidden_layers": 1, "hidden_size": 16, "intermediate_size": 24}
    return LlamaForCausalLM.from_config(small, key=jax.random.key(seed))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_tokens_are_the_models_greedy_tokens_whatever_the_draft(llama: Any, k: int) -> None:
    hf, model = llama
    ids = np.array([[5, 17, 3, 42, 8]])
    want = hf_generate(hf, ids, np.ones_like(ids), max_new_tokens=20, pad_token_id=0)
    for draft in (_draft(CASES["llama"][3], 1), model):  # one that disagrees, one that agrees
        got = generate(model, ids, max_new_tokens=20, assistant_model=draft, num_assistant_tokens=k)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_end_of_sequence_stops_as_plain_greedy(llama: Any) -> None:
    hf, model = llama
    ids = np.array([[9, 4, 1]])
    plain = hf_generate(hf, ids, np.ones_like(ids), max_new_tokens=16, pad_token_id=0)
    eos = int(plain[0, 3 + 5])
    want = hf_generate(
        hf, ids, np.ones_like(ids), max_new_tokens=16, eos_token_id=eos, pad_token_id=0
    )
    got = generate(model, ids, max_new_tokens=16, eos_token_id=eos, assistant_model=model)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_an_agreeing_draft_is_accepted_and_saves_rounds(llama: Any) -> None:
    _, model = llama
    s = GenerationSettings(24, 0, False, 1.0, None, None, None, 1.0, 1, (), 0, (), ())
    ids = jax.numpy.asarray([[5, 17, 3, 42, 8]])
    _, length, stats = speculative_decode(model, model, ids, s, 4)
    assert int(length) == 5 + 24
    assert int(stats.rounds) == 5 and int(stats.accepted) == 4 * 4 + 4  # 5 rounds of up to 5
    _, _, poor = speculative_decode(model, _draft(CASES["llama"][3], 2), ids, s, 4)
    assert int(poor.rounds) > int(stats.rounds)


def test_what_speculative_decoding_does_not_do_is_refused(llama: Any) -> None:
    _, model = llama
    gpt2 = GPT2LMHeadModel.from_config(
        {"n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 50}, key=jax.random.key(0)
    )
    ids = np.array([[1, 2, 3]])
    with pytest.raises(ValueError, match="vocabulary of 50 tokens and the model 100"):
        generate(model, ids, max_new_tokens=2, assistant_model=gpt2)
    with pytest.raises(ValueError, match="repetition_penalty cannot be used with it"):
        generate(model, ids, max_new_tokens=2, assistant_model=model, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="one prompt of at least 2 tokens"):
        generate(model, np.array([[1, 2], [3, 4]]), max_new_tokens=2, assistant_model=model)
    with pytest.raises(TypeError, match="must be a causal LM"):
        generate(
            model, ids, max_new_tokens=2, assistant_model=tm.nn.Linear(2, 2, key=jax.random.key(0))
        )
