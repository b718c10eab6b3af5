"""Sampling in `treemod.models.generate`, and its errors.

The warpers are checked against `transformers`' own (`TemperatureLogitsWarper`,
`TopKLogitsWarper`, `TopPLogitsWarper`) applied to the same logits: the kept-token sets must be
equal, and draws must follow the distribution the chained warpers give.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from treemod.models import GPT2LMHeadModel, GPT2Model, generate
from treemod.models._sampling import choose, top_k_filter, top_p_filter

_GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 32}


def _logits(seed: int, batch: int = 3, vocab: int = 50) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (batch, vocab)).astype(np.float32)


_top_k = jax.jit(top_k_filter, static_argnums=1)
_top_p = jax.jit(top_p_filter)  # p traced: one program for every p


def _kept(processed: torch.Tensor | jax.Array) -> np.ndarray:
    return np.isfinite(np.asarray(processed))


# Each k is its own compiled program: a handful of values, the edges included (k = 1, k at and
# past the vocabulary); the seeds vary freely.
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.sampled_from([1, 2, 7, 49, 50, 60]))
def test_top_k_keeps_the_set_transformers_keeps(seed: int, k: int) -> None:
    logits = _logits(seed)
    want = TopKLogitsWarper(k)(None, torch.from_numpy(logits))
    np.testing.assert_array_equal(_kept(_top_k(jnp.asarray(logits), k)), _kept(want))


def test_top_k_keeps_ties_with_the_kth_as_transformers() -> None:
    logits = np.array([[3.0, 1.0, 1.0, 1.0, 0.0]], np.float32)
    want = TopKLogitsWarper(2)(None, torch.from_numpy(logits))
    got = top_k_filter(jnp.asarray(logits), 2)
    np.testing.assert_array_equal(_kept(got), _kept(want))
    assert _kept(got).sum() == 4


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), p=st.floats(0.01, 1.0))
def test_top_p_keeps_the_set_transformers_keeps(seed: int, p: float) -> None:
    logits = _logits(seed)
    want = TopPLogitsWarper(p)(None, torch.from_numpy(logits))
    got = _top_p(jnp.asarray(logits), jnp.float32(p))
    np.testing.assert_array_equal(_kept(got), _kept(want))


def test_draws_follow_transformers_warped_distribution() -> None:
    logits = _logits(7, batch=1, vocab=20)
    warped = torch.from_numpy(logits)
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(8), TopPLogitsWarper(0.9)):
        warped = warper(None, warped)
    want = torch.softmax(warped, -1).numpy()[0]
    n = 20000
    rows = jnp.broadcast_to(jnp.asarray(logits), (n, 20))
    # The logits are an argument: as a closed-over constant XLA would fold the sort at compile
    # time, slowly.
    draws = jax.jit(
        lambda r, k: choose(r, do_sample=True, temperature=0.7, top_k=8, top_p=0.9, key=k)
    )(rows, jax.random.key(0))
    freq = np.bincount(np.asarray(draws), minlength=20) / n
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))
    # Binomial standard error at n=20000 is at most 0.0036; allow five of them.
    np.testing.assert_allclose(freq, want, atol=0.018)


@pytest.fixture(scope="module")
def model() -> GPT2LMHeadModel:
    return GPT2LMHeadModel.from_config({**_GPT2, "initializer_range": 0.2}, key=jax.random.key(1))


def test_sampling_with_top_k_1_is_greedy(model: GPT2LMHeadModel) -> None:
    ids = np.array([[0, 0, 4, 9], [3, 1, 4, 1]])
    mask = np.array([[0, 0, 1, 1], [1, 1, 1, 1]])
    greedy = generate(model, ids, attention_mask=mask, max_new_tokens=8)
    sampled = generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=8,
        do_sample=True,
        top_k=1,
        temperature=0.5,
        key=jax.random.key(3),
    )
    np.testing.assert_array_equal(np.asarray(sampled), np.asarray(greedy))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "`max_new_tokens` is 0; it must be an int in [1, "),
        ({"temperature": 0.0, "do_sample": True}, "`temperature` is 0.0; it must be a finite"),
        ({"temperature": float("nan"), "do_sample": True}, "`temperature` is nan"),
        ({"top_k": -1, "do_sample": True}, "`top_k` is -1; it must be an int in [0, "),
        ({"top_p": 1.5, "do_sample": True}, "`top_p` is 1.5; it must be a number in (0, 1]"),
        ({"min_p": -0.1, "do_sample": True}, "`min_p` is -0.1; it must be a number in [0, 1]"),
        ({"repetition_penalty": 0}, "`repetition_penalty` is 0; it must be a finite number > 0"),
        ({"min_new_tokens": -2}, "`min_new_tokens` is -2; it must be an int in [0, "),
        ({"eos_token_id": "x"}, "`eos_token_id` is 'x'; it must be a token id or a list"),
        ({"eos_token_id": 2**40}, "`eos_token_id` is 1099511627776; it must be a token id"),
        ({"pad_token_id": 1.0}, "`pad_token_id` is 1.0; it must be a token id"),
        (
            {"pad_token_id": 2**40},
            "`pad_token_id` is 1099511627776; it must be a token id or a "
            "list of token ids in [0, 100)",
        ),
        ({"do_sample": "yes"}, "`do_sample` is 'yes'; it must be True or False"),
        (
            {"do_sample": True},
            "(do_sample=True, from the call or the model's generation config) needs `key=`",
        ),
        (
            {"do_sample": True, "key": jax.random.split(jax.random.key(0), 3)},
            "`key` must be one PRNG key or 1 keys",
        ),
        ({"num_return_sequences": 2}, "`num_return_sequences` is 2, but greedy decoding"),
        ({"max_new_tokens": 30}, "prompt length 3 + max_new_tokens 30 exceeds the config's n_pos"),
        ({"max_new_tokens": None, "max_length": 3}, "`max_length` = 3 leaves no new token"),
        ({"pad_to_multiple_of": 0}, "`pad_to_multiple_of` must be an int >= 1; got 0"),
        ({"input_ids": np.ones((1, 3))}, "`input_ids` must be integer token ids"),
        ({"input_ids": np.ones((1, 0), int)}, "`input_ids` has shape [1, 0]: generation needs"),
        (
            {"input_ids": np.array([[1, 100]])},
            "`input_ids`[0, 1] is 100, not a token id of the model's vocabulary [0, 100)",
        ),
        ({"input_ids": np.array([[-1, 2]])}, "`input_ids`[0, 0] is -1, not a token id"),
        ({"input_ids": np.array([[1, 2**32 + 3]], np.int64)}, "`input_ids`[0, 1] is 4294967299"),
        ({"attention_mask": np.ones((1, 4))}, "`attention_mask` must have the shape"),
        ({"attention_mask": np.array([[1, 1, 0]])}, "`attention_mask` row 0 has padding after or"),
        ({"attention_mask": np.array([[1, 0, 1]])}, "`attention_mask` row 0 has padding after or"),
        ({"attention_mask": np.array([[0, 0, 0]])}, "`attention_mask` row 0 has no token"),
        (
            {"generation_config": {"num_beams": 4}},
            "`generation_config` key 'num_beams' is 4, which treemod's generate does not implement",
        ),
        (
            {"generation_config": {"top_k": "x"}, "do_sample": True, "key": jax.random.key(0)},
            "`generation_config` key 'top_k' is 'x'",
        ),
    ],
)
def test_bad_arguments_are_named(model: GPT2LMHeadModel, kwargs: dict, message: str) -> None:
    arguments = {"input_ids": np.array([[1, 2, 3]]), "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError) as info:
        generate(model, **arguments)
    assert "generate (GPT2LMHeadModel)" in str(info.value)
    assert message in str(info.value)


def test_greedy_decoding_ignores_temperature_zero_as_transformers(model: GPT2LMHeadModel) -> None:
    ids = np.array([[3, 1, 4, 1]])
    greedy = generate(model, ids, max_new_tokens=5)
    zero = generate(model, ids, max_new_tokens=5, do_sample=False, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(zero), np.asarray(greedy))


def test_a_model_without_a_head_is_refused() -> None:
    body = GPT2Model.from_config(_GPT2, key=jax.random.key(0))
    with pytest.raises(TypeError, match="GPT2Model is not a causal language model"):
        generate(body, np.array([[1, 2]]), max_new_tokens=2)
