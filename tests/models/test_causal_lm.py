"""`CausalLM`'s contract is all `generate` needs: a family defined here, unknown to
`_generate.py`, generates, and its greedy tokens equal those of a step-by-step recomputation
with full forward passes (no cache: the prompt plus the tokens so far, the most likely next
token appended each step). Its attention is written here in plain `jax.numpy`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod as tm
import treemod.nn as nn
from treemod.models import PretrainedConfig, generate
from treemod.models._causal_lm import CacheLayout, CausalLM, KVCache, LMParts


class TinyLayer(tm.Module):
    """One-head causal self-attention with a residual; the cache is an argument, as the zoo's."""

    qkv: nn.Linear
    out: nn.Linear

    def __call__(
        self, carry: tuple[Array, KVCache | None], mask: Array
    ) -> tuple[Array, KVCache | None]:
        x, cache = carry
        batch, seq, dim = x.shape
        q, k, v = (t.reshape(batch, seq, 1, dim) for t in jnp.split(self.qkv(x), 3, axis=-1))
        if cache is not None:
            cache, k, v = cache.write(k, v)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(dim)
        scores = jnp.where(mask, scores, -jnp.inf)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        return x + self.out(mixed.reshape(batch, seq, dim)), cache


class TinyLM(CausalLM):
    """Token and position embeddings, a stack of `TinyLayer`s, the head tied to the tokens."""

    architecture: ClassVar[str] = "TinyLM"
    model_type: ClassVar[str] = "tiny-lm"
    token_embedding_name: ClassVar[str] = "embed"

    embed: nn.Embedding
    positions: nn.Embedding
    layers: nn.Stack

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        config = PretrainedConfig(config)
        dim, init = config["dim"], nn.init.normal(1.0)
        k1, k2, k3 = jax.random.split(key, 3)

        def layer(k: PRNGKeyArray) -> TinyLayer:
            ka, kb = jax.random.split(k)
            return TinyLayer(nn.Linear(dim, 3 * dim, key=ka), nn.Linear(dim, dim, key=kb))

        return cls(
            config=config,
            embed=nn.Embedding(config["vocab_size"], dim, weight_init=init, key=k1),
            positions=nn.Embedding(config["n_positions"], dim, weight_init=init, key=k2),
            layers=nn.Stack(layer, config["n_layer"], key=k3),
        )

    def cache_layout(self) -> CacheLayout:
        weight = self.embed.weight
        return CacheLayout(len(self.layers), 1, weight.shape[1], weight.dtype)

    def decode(self, ids: Array, positions: Array, cache: KVCache) -> tuple[Array, KVCache]:
        x = self.embed(ids) + self.positions(positions)
        x, cache = self.layers((x, cache), cache.mask(ids.shape[1], None))
        return x, cache

    def lm_parts(self) -> LMParts:
        return LMParts(self, self.embed, None)  # the model is its own decoder

    def max_positions(self) -> tuple[str, int]:
        return "n_positions", self.positions.weight.shape[0]

    def __call__(self, *, input_ids: Any) -> Array:
        ids = jnp.asarray(input_ids)
        seq = ids.shape[1]
        x = self.embed(ids) + self.positions(jnp.arange(seq))[None]
        mask = jnp.tril(jnp.ones((seq, seq), bool))[None, None]
        x, _ = self.layers((x, None), mask)
        return self.logits(x)


CONFIG = {"dim": 16, "vocab_size": 50, "n_positions": 24, "n_layer": 3}


@pytest.fixture(scope="module")
def model() -> TinyLM:
    return TinyLM.from_config(CONFIG, key=jax.random.key(0))


def test_a_family_unknown_to_generate_generates_its_greedy_tokens(model: TinyLM) -> None:
    prompt = np.random.default_rng(0).integers(0, 50, (3, 5))
    new = 8
    tokens = prompt
    for _ in range(new):  # the reference: a full forward pass per step, no cache
        logits = np.asarray(model(input_ids=tokens))
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None]], axis=1)
    got = generate(model, prompt, max_new_tokens=new)
    np.testing.assert_array_equal(np.asarray(got), tokens)
    assert len(set(tokens[:, 5:].ravel())) > 2, "the case should not repeat one token"


def test_the_tied_head_and_the_position_limit_come_from_the_contract(model: TinyLM) -> None:
    assert model.tied_weights() == {"lm_head.weight": "embed.weight"}
    with pytest.raises(ValueError, match="exceeds the config's n_positions=24"):
        generate(model, np.ones((1, 5), int), max_new_tokens=20)


def test_attend_takes_a_float32_bias_with_bfloat16_inputs() -> None:
    import jax.numpy as jnp

    from treemod.models._attention_parts import attend

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 3, 2, 4)), jnp.bfloat16) for _ in range(3))
    bias = jnp.asarray(rng.normal(size=(1, 2, 3, 3)), jnp.float32)
    got = attend(q, k, v, None, scale=0.5, bias=bias)
    s = np.einsum("bqhd,bkhd->bhqk", *(np.asarray(x, np.float32) for x in (q, k))) * 0.5
    p = np.exp(s + np.asarray(bias) - (s + np.asarray(bias)).max(-1, keepdims=True))
    want = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), np.asarray(v, np.float32))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-2)
