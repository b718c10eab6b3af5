"""`apply_policy`: which operation runs in which dtype, read off the jaxpr; master weights stay
float32 through optax updates; the tree (and its state-dict names) is unchanged."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import treemod as tm
import treemod.nn as nn
import treemod.precision as precision
from treemod.models.llama import LlamaForCausalLM

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _eqns(jaxpr: Any, inside: str = "") -> list[tuple[str, Any]]:
    """Every equation of a jaxpr with the names of the `jit`s it sits in."""
    out = []
    for eqn in jaxpr.eqns:
        out.append((inside, eqn))
        for p in eqn.params.values():
            sub = getattr(p, "jaxpr", None)
            if sub is not None:
                name = inside + "/" + str(eqn.params.get("name", eqn.primitive.name))
                out.extend(_eqns(getattr(sub, "jaxpr", sub), name))
    return out


def _dtypes(eqn: Any) -> set[str]:
    return {str(v.aval.dtype) for v in eqn.outvars if hasattr(v.aval, "dtype")}


class CNN(tm.Module):
    conv: nn.Conv2d
    norm: nn.BatchNorm
    group: nn.GroupNorm
    head: nn.Linear

    def __call__(self, x: Any) -> Any:
        x = jax.nn.relu(self.group(self.norm(self.conv(x))))
        return self.head(x.reshape(x.shape[0], -1))


def _cnn() -> CNN:
    keys = jax.random.split(jax.random.key(0), 2)
    return CNN(
        nn.Conv2d(1, 4, 3, padding=1, key=keys[0]),
        nn.BatchNorm(4),
        nn.GroupNorm(2, 4, spatial_ndim=2),
        nn.Linear(4 * 8 * 8, 10, key=keys[1]),
    )


@pytest.mark.parametrize("compute", [jnp.bfloat16, jnp.float16])
def test_cnn_jaxpr_convs_in_compute_dtype_norms_and_running_stats_in_float32(compute: Any) -> None:
    model = precision.apply_policy(_cnn(), compute)
    x = jnp.ones((2, 1, 8, 8))
    jaxpr, out_shape, _ = tm.filter_make_jaxpr(lambda m, x: tm.stateful(m)(x))(model, x)
    eqns = _eqns(jaxpr.jaxpr)
    heavy = [e for _, e in eqns if e.primitive.name in ("conv_general_dilated", "dot_general")]
    assert len(heavy) == 2 and all(_dtypes(e) == {jnp.dtype(compute).name} for e in heavy)
    # Every low-precision value comes from a convolution or matmul layer, or is a cast into one.
    name = jnp.dtype(compute).name
    low = {
        (w, e.primitive.name)
        for w, e in eqns
        if name in _dtypes(e)
        and not (
            w.endswith(("Conv._flat", "Linear._flat"))
            or e.primitive.name in ("convert_element_type", "jit")
        )
    }
    assert low == set()
    # Normalisation statistics (BatchNorm's and GroupNorm's) are float32.
    stats = [e for _, e in eqns if e.primitive.name in ("reduce_sum", "rsqrt", "stop_gradient")]
    assert len(stats) >= 6 and all(_dtypes(e) == {"float32"} for e in stats)
    assert any("GroupNorm" in w for w, _ in eqns)
    logits, new_model = out_shape
    assert logits.dtype == jnp.float32
    leaves = [x for x in jax.tree_util.tree_leaves(new_model) if hasattr(x, "dtype")]
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.float32)}  # running statistics too


def test_llama_jaxpr_rmsnorm_and_softmax_in_float32_projections_in_bfloat16() -> None:
    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    mixed = precision.apply_policy(model, jnp.bfloat16)
    ids = jnp.array([[1, 2, 3, 4]])
    jaxpr, out, _ = tm.filter_make_jaxpr(lambda m, x: m(input_ids=x))(mixed, ids)
    assert out.dtype == jnp.float32
    eqns = _eqns(jaxpr.jaxpr)
    projections = [e for w, e in eqns if "Linear" in w and e.primitive.name == "dot_general"]
    assert len(projections) == 8  # q, k, v, o, gate, up, down in the scanned layer; lm_head
    assert all(_dtypes(e) == {"bfloat16"} for e in projections)
    norms = [e for w, e in eqns if "RMSNorm" in w]
    assert norms and all("bfloat16" not in _dtypes(e) for e in norms)
    softmax = [e for _, e in eqns if e.primitive.name in ("exp", "reduce_max")]
    assert softmax and all(_dtypes(e) == {"float32"} for e in softmax)
    # Close to the float32 model (bfloat16 has 8 bits of mantissa).
    want = np.asarray(model(input_ids=ids))
    got = np.asarray(mixed(input_ids=ids))
    assert np.abs(got - want).max() / np.abs(want).max() < 0.05


def test_tree_and_state_dict_names_unchanged_and_policy_removable() -> None:
    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    mixed = precision.apply_policy(model, jnp.bfloat16)
    assert isinstance(mixed, LlamaForCausalLM) and precision.policy_of(mixed) is not None
    assert set(tm.state_dict(mixed)) == set(tm.state_dict(model))
    assert jax.tree_util.tree_structure(mixed) != jax.tree_util.tree_structure(model)
    back = precision.remove_policy(mixed)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(model)
    assert precision.policy_of(back) is None
    # Applying the same policy twice gives the same classes: one compilation.
    again = precision.apply_policy(model, jnp.bfloat16)
    assert jax.tree_util.tree_structure(again) == jax.tree_util.tree_structure(mixed)


def test_master_weights_stay_float32_through_optax_updates() -> None:
    model = precision.apply_policy(_cnn(), jnp.bfloat16)
    opt = optax.sgd(1e-2, momentum=0.9)
    params = tm.filter(model, tm.is_inexact_array)
    opt_state = opt.init(params)
    x, y = jnp.ones((4, 1, 8, 8)), jnp.array([0, 1, 2, 3])

    @tm.filter_jit
    def step(model: Any, opt_state: Any) -> Any:
        def loss(m: Any) -> Any:
            logits, m = tm.stateful(m)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), m

        (value, new), grads = tm.filter_value_and_grad(loss, has_aux=True)(model)
        updates, opt_state = opt.update(grads, opt_state, tm.filter(model, tm.is_inexact_array))
        return tm.apply_updates(new, updates), opt_state, value, grads

    for _ in range(3):
        model, opt_state, value, grads = step(model, opt_state)
    assert value.dtype == jnp.float32
    for tree in (model, grads, opt_state):
        dtypes = {x.dtype for x in jax.tree_util.tree_leaves(tree) if tm.is_inexact_array(x)}
        assert dtypes == {jnp.dtype(jnp.float32)}, dtypes
    assert precision.policy_of(model) is not None  # the update kept the policy's classes


def test_params_stored_in_bfloat16_become_float32_master_weights() -> None:
    layer = nn.Sequential([nn.Linear(3, 3, dtype=jnp.bfloat16, key=jax.random.key(0))])
    mixed = precision.apply_policy(layer, jnp.bfloat16)
    assert mixed.layers[0].weight.dtype == jnp.float32
    assert mixed(jnp.ones(3)).dtype == jnp.float32


def test_bad_policy_names_the_field() -> None:
    with pytest.raises(ValueError, match="Policy: `compute_dtype` must be a floating dtype"):
        precision.Policy(compute_dtype=jnp.int8)
    with pytest.raises(TypeError, match="apply_policy: pass either a Policy"):
        precision.apply_policy(_cnn(), precision.Policy(), output_dtype=jnp.float16)


def test_lora_under_a_policy_trains_float32_adapters_with_bfloat16_matmuls() -> None:
    import treemod.lora as lora

    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=4, alpha=8, key=jax.random.key(1))
    mixed = precision.apply_policy(tuned, jnp.bfloat16)
    adapters, frozen = tm.partition(mixed, lora.trainable(mixed))
    ids = jnp.array([[1, 2, 3, 4]])

    def loss(adapters: Any) -> Any:
        return jnp.mean(tm.combine(adapters, frozen)(input_ids=ids))

    jaxpr, _, _ = tm.filter_make_jaxpr(tm.filter_grad(loss))(adapters)
    matmuls = [
        e for w, e in _eqns(jaxpr.jaxpr) if "Linear" in w and e.primitive.name == "dot_general"
    ]
    assert matmuls and all(_dtypes(e) == {"bfloat16"} for e in matmuls)
    grads = tm.filter_grad(loss)(adapters)
    leaves = jax.tree_util.tree_leaves(grads)
    assert len(leaves) == 4 and {g.dtype for g in leaves} == {jnp.dtype(jnp.float32)}
