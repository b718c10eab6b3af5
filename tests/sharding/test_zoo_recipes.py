"""The recipes of docs/sharding.md on a zoo Llama, 8 fake CPU devices: the collectives XLA
inserts in the FSDP training step and in the tensor-parallel forward (the page explains each),
FSDP+TP training equal to one device's, tensor-parallel generation equal to one device's."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import jax
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from sharding_models import mesh

import treemod as tm
import treemod.models as tmm

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
}
TOKENS = np.asarray(jax.random.randint(jax.random.key(1), (8, 9), 0, 64))
ADAMW = optax.adamw(1e-2)


def collectives(hlo: str) -> list[tuple[str, str]]:
    """`(kind, result shape without layout)` of each collective in compiled HLO text."""
    kinds = "all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute"
    found = re.finditer(rf"= (.*?) ({kinds})(?:-start)?\(", hlo)
    return [(m.group(2), re.sub(r"\{[0-9,]*\}", "", m.group(1))) for m in found]


def lm_loss(model: Any, tokens: jax.Array) -> jax.Array:
    logits = model(input_ids=tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def fine_tune(model: Any, steps: int, devices: Any = None, rules: Any = None) -> tuple[Any, str]:
    @tm.filter_jit
    def step(model: Any, opt_state: Any, tokens: jax.Array) -> Any:
        loss, grads = tm.filter_value_and_grad(lm_loss)(model, tokens)
        if devices is not None:
            grads = tm.filter_shard(grads, tm.model_shardings(grads, devices, rules))
        with jax.numpy_dtype_promotion("standard"):  # optax mixes its int step count with floats
            updates, opt_state = ADAMW.update(grads, opt_state, tm.filter(model, tm.is_array))
        return tm.apply_updates(model, updates), opt_state, loss

    opt_state = ADAMW.init(tm.filter(model, tm.is_array))
    tokens: Any = TOKENS
    if devices is not None:
        model, opt_state = tm.shard(model, devices, rules), tm.shard(opt_state, devices, rules)
        tokens = jax.device_put(TOKENS, NamedSharding(devices, P("data")))
    hlo = step.lower(model, opt_state, tokens).compile().as_text()
    for _ in range(steps):
        model, opt_state, _ = step(model, opt_state, tokens)
    return model, hlo


@pytest.fixture(scope="module")
def llama() -> Any:
    return tmm.LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))


@pytest.fixture(scope="module")
def one_device(llama: Any) -> Any:
    return fine_tune(llama, 2)[0]


def _assert_same(a: Any, b: Any) -> None:
    for x, y in zip(
        jax.tree.leaves(tm.filter(a, tm.is_array)),
        jax.tree.leaves(tm.filter(b, tm.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_fsdp_step_gathers_each_weight_and_sums_gradients(llama: Any, one_device: Any) -> None:
    rules, devices = tm.fsdp_rules(), mesh((8, 1), ("data", "model"))
    with tm.axis_rules(devices, rules):
        tuned, hlo = fine_tune(llama, 2, devices, rules)
    _assert_same(tuned, one_device)
    found = collectives(hlo)
    gathered = Counter(shape for kind, shape in found if kind == "all-gather")
    # forward and backward scan bodies: q, k, v, o; gate, up; down; two norms. Once each:
    # embedding and head (forward), head and final norm (backward), final norm (forward).
    assert gathered == {"f32[32,32]": 8, "f32[64,32]": 6, "f32[32,64]": 2, "f32[32]": 6}
    reduced = [shape for kind, shape in found if kind == "all-reduce"]
    # The gradient sums, combined: the stacked layers' and the rest with the loss.
    assert len(reduced) == 2 and all(shape.startswith("(") for shape in reduced)
    assert Counter(kind for kind, _ in found).keys() == {"all-gather", "all-reduce"}


def test_fsdp_tp_training_equals_one_devices(llama: Any, one_device: Any) -> None:
    rules, devices = tm.fsdp_tp_rules(), mesh((2, 4), ("data", "model"))
    with tm.axis_rules(devices, rules):
        tuned, _ = fine_tune(llama, 2, devices, rules)
    _assert_same(tuned, one_device)
    assert tuned.model.layers.layers.mlp.down_proj.weight.sharding.spec == P(None, "data", "model")


def test_tensor_parallel_forward_all_reduces_once_per_half_block(llama: Any) -> None:
    rules, devices = tm.tensor_parallel_rules(), mesh((1, 8), ("data", "model"))
    sharded = tm.shard(llama, devices, rules)
    prompt = np.array([[1, 5, 9, 3], [7, 2, 4, 4]])
    with tm.axis_rules(devices, rules):
        forward = tm.filter_jit(lambda m, ids: m(input_ids=ids))
        found = collectives(forward.lower(sharded, prompt).compile().as_text())
        generated = tmm.generate(sharded, prompt, max_new_tokens=6)
    # the embedding lookup (vocabulary rows split), then attention's and the MLP's output
    # projections (split by input) in the scan body; logits stay split by vocabulary
    assert sorted(found) == [
        ("all-reduce", "f32[2,4,32]"),
        ("all-reduce", "f32[8,32]"),
        ("all-reduce", "f32[8,32]"),
    ]
    np.testing.assert_array_equal(generated, tmm.generate(llama, prompt, max_new_tokens=6))
