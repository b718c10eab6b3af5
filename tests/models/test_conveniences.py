"""What `transformers` users reach for on a model: `num_parameters`, `dtype`, casting,
`config.<key>`; counted against `transformers`' own models."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
import transformers
from lm_reference import pair

import treemod as tm
from treemod.models import BertModel, GPT2LMHeadModel, LlamaForCausalLM

_LLAMA = {
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
CASES: dict[str, tuple[Any, Any, Any, dict[str, Any]]] = {
    "gpt2-tied": (
        transformers.GPT2LMHeadModel,
        transformers.GPT2Config,
        GPT2LMHeadModel,
        {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 64},
    ),
    "llama-untied": (
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig,
        LlamaForCausalLM,
        _LLAMA,
    ),
    "llama-tied": (
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig,
        LlamaForCausalLM,
        {**_LLAMA, "tie_word_embeddings": True},
    ),
    "bert": (
        transformers.BertModel,
        transformers.BertConfig,
        BertModel,
        {
            "vocab_size": 64,
            "hidden_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 32,
        },
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_num_parameters_counts_as_transformers(name: str) -> None:
    hf, model = pair(*CASES[name])
    assert model.num_parameters() == hf.num_parameters()
    assert model.num_parameters(exclude_embeddings=True) == hf.num_parameters(
        exclude_embeddings=True
    )


def test_dtype_casting_and_config_attributes() -> None:
    model = LlamaForCausalLM.from_config(_LLAMA, key=jax.random.key(0))
    assert model.dtype == jnp.float32 and model.config.vocab_size == 64
    half = model.astype(jnp.bfloat16)
    assert half.dtype == jnp.bfloat16
    assert {x.dtype for x in jax.tree.leaves(tm.filter(half, tm.is_param))} == {
        jnp.dtype("bfloat16")
    }
    with pytest.raises(AttributeError, match="PretrainedConfig has no key 'vocab'"):
        _ = model.config.vocab
    with pytest.raises(TypeError, match="LlamaForCausalLM.astype: int32 is not a floating"):
        model.astype(jnp.int32)
