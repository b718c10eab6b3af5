"""Zoo models under the sharding presets on 8 fake CPU devices: logits equal one device's, and
the weights split the way the layout says (attention by heads, the MLP by hidden units)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from sharding_models import mesh

import treemod as tm
from treemod.models import GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM

GPT2 = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "n_positions": 16}
LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
}
IDS = np.array([[1, 5, 9, 3, 7, 2, 4, 4]] * 4)


@pytest.mark.parametrize(
    ("rules", "shape"),
    [(tm.tensor_parallel_rules(), (1, 8)), (tm.fsdp_tp_rules(), (2, 4)), (tm.fsdp_rules(), (8, 1))],
    ids=["tp", "fsdp+tp", "fsdp"],
)
def test_gpt2_logits_equal_one_devices(rules: Any, shape: tuple[int, int]) -> None:
    model = GPT2LMHeadModel.from_config(GPT2, key=jax.random.key(0))
    want = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(model, IDS))
    sharded = tm.shard(model, mesh(shape, ("data", "model")), rules)
    got = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(sharded, IDS))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_gpt2_tensor_parallel_layout() -> None:
    model = GPT2LMHeadModel.from_config(GPT2, key=jax.random.key(0))
    sharded = tm.shard(model, mesh((1, 8), ("data", "model")), tm.tensor_parallel_rules())
    block = sharded.transformer.h.layers
    assert block.attn.c_attn.weight.sharding.spec == P(None, None, "model")  # heads (out)
    assert block.attn.c_proj.weight.sharding.spec == P(None, "model")  # heads (in)
    assert block.mlp.c_fc.weight.sharding.spec == P(None, None, "model")
    assert block.mlp.c_proj.weight.sharding.spec == P(None, "model")


@pytest.mark.parametrize("cls", [LlamaForCausalLM, Qwen2ForCausalLM])
@pytest.mark.parametrize(
    ("rules", "shape"),
    [(tm.tensor_parallel_rules(), (1, 8)), (tm.fsdp_tp_rules(), (2, 4))],
    ids=["tp", "fsdp+tp"],
)
def test_llama_family_logits_equal_one_devices(
    cls: Any, rules: Any, shape: tuple[int, int]
) -> None:
    model = cls.from_config(LLAMA, key=jax.random.key(0))
    want = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(model, IDS))
    sharded = tm.shard(model, mesh(shape, ("data", "model")), rules)
    got = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(sharded, IDS))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    attention = sharded.model.layers.layers.self_attn
    assert attention.q_proj.weight.sharding.spec[1] == "model"  # by heads (out features)
    assert attention.o_proj.weight.sharding.spec[2] == "model"  # by heads (in features)
