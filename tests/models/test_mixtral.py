"""Mixtral (`MixtralModel`, `MixtralForCausalLM`) against `transformers`' own: top-k routing of
the softmaxed router logits, renormalised, over experts held in stacked arrays; files in the
per-expert layout `transformers` 5.24 writes, both ways; padded batches, a hypothesis test over
the config values, LoRA against PEFT, and refusals named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_reference import run
from lm_variant_checks import (
    PEFT_WARNING,
    check_bfloat16,
    check_directories,
    check_lora,
    check_padded_batch,
    pair_through_files,
    refused,
)

import treemod as tm
from treemod.models.mixtral import MixtralForCausalLM, MixtralModel

# Cross-library checks against transformers, which the oldest end's lower-bound dependencies
# resolve to an older release that computes these families otherwise: `make test` runs them
# on the newest end (the `slow` marker).
pytestmark = pytest.mark.slow

T = transformers
BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def _pair(hf_cls: Any, config: dict[str, Any], tmp_path: Path) -> tuple[Any, Any]:
    return pair_through_files(hf_cls, T.MixtralConfig, {**BASE, **config}, tmp_path / "pair")


@pytest.mark.parametrize(
    "hf_cls, extra",
    [
        (T.MixtralModel, {}),
        (T.MixtralForCausalLM, {"num_experts_per_tok": 1, "tie_word_embeddings": True}),
        (T.MixtralForCausalLM, {"num_experts_per_tok": 3, "sliding_window": 3}),
        (T.MixtralForCausalLM, {"num_experts_per_tok": 4, "hidden_act": "gelu"}),
    ],
)
def test_padded_batch_matches_transformers(
    hf_cls: Any, extra: dict[str, Any], tmp_path: Path
) -> None:
    hf, model = _pair(hf_cls, extra, tmp_path)
    assert type(model).__name__ == hf_cls.__name__
    check_padded_batch(hf, model, 100)


def test_experts_are_stacked_and_routing_chooses_among_them(tmp_path: Path) -> None:
    hf, model = _pair(T.MixtralForCausalLM, {}, tmp_path)
    experts = model.model.layers.layers.mlp.experts
    assert experts.gate_up_proj.shape == (2, 4, 48, 32)
    assert experts.down_proj.shape == (2, 4, 32, 24)
    layer = hf.model.layers[1].mlp.experts
    np.testing.assert_array_equal(experts.gate_up_proj[1], layer.gate_up_proj.detach().numpy())
    # The tokens of a batch are routed to different experts (the choice matters).
    block = model.model.layers[0].mlp
    x = jax.random.normal(jax.random.key(0), (1, 16, 32))
    chosen = jax.lax.top_k(block.gate(x[0]), 2)[1]
    assert len(np.unique(np.asarray(chosen))) == 4


@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_config_values_match_transformers(data: Any, tmp_path_factory: Any) -> None:
    experts = data.draw(st.integers(1, 5))
    heads, kv_heads = data.draw(st.sampled_from([(2, 1), (4, 2), (4, 4)]))
    config = {
        "vocab_size": 60,
        "intermediate_size": data.draw(st.sampled_from([8, 20])),
        "num_hidden_layers": data.draw(st.integers(1, 2)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_local_experts": experts,
        "num_experts_per_tok": data.draw(st.integers(1, experts)),
        "hidden_act": data.draw(st.sampled_from(["silu", "gelu"])),
        "rms_norm_eps": data.draw(st.sampled_from([1e-5, 1e-3])),
        "tie_word_embeddings": data.draw(st.booleans()),
        "sliding_window": data.draw(st.sampled_from([None, 2])),
        "rope_theta": data.draw(st.sampled_from([100.0, 10000.0])),
    }
    hf, model = _pair(T.MixtralForCausalLM, config, tmp_path_factory.mktemp("mixtral"))
    check_padded_batch(hf, model, 60, seq=6)


def test_num_experts_is_read_as_num_local_experts() -> None:
    config: dict[str, Any] = {k: v for k, v in BASE.items() if k != "num_local_experts"}
    model = tm.filter_eval_shape(
        lambda: MixtralModel.from_config({**config, "num_experts": 3}, key=jax.random.key(0))
    )
    assert model.layers.layers.mlp.gate.weight.shape == (2, 3, 32)
    assert T.MixtralConfig.from_dict({**config, "num_experts": 3}).num_local_experts == 3


def test_directories_both_ways(tmp_path: Path) -> None:
    hf, _ = _pair(T.MixtralForCausalLM, {}, tmp_path)
    check_directories(hf, tmp_path, 100)


@pytest.mark.filterwarnings(PEFT_WARNING)
def test_lora_equals_peft(tmp_path: Path) -> None:
    hf, model = _pair(T.MixtralForCausalLM, {}, tmp_path)
    check_lora(hf, model, ["q_proj", "v_proj", "o_proj"], tmp_path, 100)


def test_jit_forward_traces_the_routing() -> None:
    model = MixtralForCausalLM.from_config(BASE, key=jax.random.key(0))
    ids = np.array([[1, 2, 3, 4]])
    np.testing.assert_allclose(run(model, {"input_ids": ids}), model(input_ids=ids), rtol=1e-5)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"output_router_logits": True}, "output_router_logits"),
        ({"router_jitter_noise": 0.1}, "router_jitter_noise"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"num_local_experts": 0}, "num_local_experts"),
        ({"sliding_window": 0}, "sliding_window"),
    ],
)
def test_refused_config_values_are_named(change: dict[str, Any], key: str) -> None:
    refused(MixtralForCausalLM, {**BASE, **change}, key)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_grouped_and_dense_experts_agree(dtype: Any) -> None:
    # Accelerators run the chosen experts only (ragged_dot), CPU runs all of them weighted.
    model = MixtralModel.from_config(BASE, key=jax.random.key(0), dtype=dtype)
    block = model.layers[0].mlp
    x = jax.random.normal(jax.random.key(1), (9, 32)).astype(dtype)
    probs = jax.nn.softmax(block.gate(x).astype(np.float32), axis=-1)
    top, index = jax.lax.top_k(probs, 2)
    top = top / top.sum(-1, keepdims=True)
    grouped = block.experts(x, index, top, grouped=True)
    dense = block.experts(x, index, top, grouped=False)
    assert grouped.dtype == dense.dtype == x.dtype
    tol = 1e-6 if dtype is np.float32 else 2e-2
    np.testing.assert_allclose(
        np.asarray(grouped, np.float32), np.asarray(dense, np.float32), rtol=tol, atol=tol
    )


def test_bfloat16() -> None:
    check_bfloat16(MixtralForCausalLM, BASE)
