"""`treemod.lora` on plain treemod layers: PEFT's name matching (against peft's own function),
Stacks, training only the adapters under filter_jit, and every error path."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from peft.tuners.tuners_utils import check_target_module_exists

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn

PARTS = st.sampled_from(["model", "layers", "0", "1", "self_attn", "q_proj", "proj", "mlp"])


@given(
    name=st.lists(PARTS, min_size=1, max_size=5).map(".".join),
    targets=st.one_of(
        st.lists(st.lists(PARTS, min_size=1, max_size=2).map(".".join), max_size=3),
        st.sampled_from([r".*q_proj", r"model\..*", r".*\.0\..*", "q_proj", r".*(proj|mlp)"]),
    ),
)
def test_target_matching_is_peft_s(name: str, targets: Any) -> None:
    config = SimpleNamespace(target_modules=targets, exclude_modules=None, target_parameters=None)
    assert lora.matches_target(targets, name) == bool(check_target_module_exists(config, name))


class Block(tm.Module):
    fc: nn.Linear
    out: nn.Linear

    def __call__(self, x: Any) -> Any:
        return x + self.out(jnp.tanh(self.fc(x)))


def _stack() -> nn.Stack:
    return nn.Stack(
        lambda k: Block(nn.Linear(6, 12, key=k), nn.Linear(12, 6, key=jax.random.fold_in(k, 1))),
        3,
        key=jax.random.key(0),
    )


def test_stack_adapters_get_the_layer_axis_and_compute_per_layer() -> None:
    model = nn.Sequential([_stack()])
    tuned = lora.add_lora(model, ["fc"], r=2, alpha=3, key=jax.random.key(1))
    layer = tuned.layers[0].layers.fc
    assert type(layer).__name__ == "LoRALinear"
    assert layer.lora_A.weight.shape == (3, 2, 6) and layer.lora_B.weight.shape == (3, 12, 2)
    b = jax.random.normal(jax.random.key(2), (3, 12, 2))
    with tm.shape_checks(False):
        tuned = tm.tree_at(lambda m: m.layers[0].layers.fc.lora_B.weight, tuned, b)
    x = jax.random.normal(jax.random.key(3), (4, 6))
    # Plain NumPy, layer by layer: x + W2 tanh(W1 x + b1 + 1.5 B A x) + b2.
    want = np.asarray(x, np.float64)
    stacked = tuned.layers[0].layers
    for i in range(3):
        a = np.asarray(stacked.fc.lora_A.weight[i], np.float64)
        w1, b1 = (
            np.asarray(t[i], np.float64)
            for t in (stacked.fc.base_layer.weight, stacked.fc.base_layer.bias)
        )
        w2, b2 = (np.asarray(t[i], np.float64) for t in (stacked.out.weight, stacked.out.bias))
        h = want @ w1.T + b1 + 1.5 * (want @ a.T) @ np.asarray(b[i], np.float64).T
        want = want + np.tanh(h) @ w2.T + b2
    np.testing.assert_allclose(
        tm.filter_jit(lambda m, x: m(x))(tuned, x), want, rtol=1e-5, atol=1e-5
    )
    names = set(tm.state_dict(tuned))
    assert {f"0.{i}.fc.lora_A.weight" for i in range(3)} <= names
    merged = lora.merge(tuned)
    np.testing.assert_allclose(merged(x), want, rtol=1e-5, atol=1e-5)
    assert jax.tree_util.tree_structure(merged) == jax.tree_util.tree_structure(model)


def test_training_moves_only_the_adapters() -> None:
    import optax

    model = nn.Sequential([_stack()])
    tuned = lora.add_lora(model, r".*\.(fc|out)", r=2, alpha=2, key=jax.random.key(1))
    adapters, frozen = tm.partition(tuned, lora.trainable(tuned))
    opt = optax.sgd(0.1)
    opt_state = opt.init(adapters)
    x = jax.random.normal(jax.random.key(3), (8, 6))

    @tm.filter_jit
    def step(adapters: Any, opt_state: Any) -> Any:
        loss = lambda a: jnp.mean((tm.combine(a, frozen)(x) - 1.0) ** 2)  # noqa: E731
        value, grads = tm.filter_value_and_grad(loss)(adapters)
        updates, opt_state = opt.update(grads, opt_state)
        return tm.apply_updates(adapters, updates), opt_state, value

    losses = []
    for _ in range(20):
        adapters, opt_state, value = step(adapters, opt_state)
        losses.append(float(value))
    assert losses[-1] < losses[0]
    trained = tm.combine(adapters, frozen)
    before, after = tm.state_dict(tuned), tm.state_dict(trained)
    changed = {k for k in before if not np.array_equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any(".lora_A." in k for k in changed) and any(".lora_B." in k for k in changed)


def test_selecting_some_layers_of_a_stack_is_refused_by_name() -> None:
    model = nn.Sequential([_stack()])
    with pytest.raises(ValueError, match=r"some but not all layers of the Stack at '0'"):
        lora.add_lora(model, r"0\.1\.fc", r=2, alpha=2, key=jax.random.key(0))


def test_add_lora_errors_name_the_targets_and_modules() -> None:
    model = nn.Sequential([nn.Linear(3, 3, key=jax.random.key(0)), nn.LayerNorm(3)])
    with pytest.raises(ValueError, match=r"target_modules=\['q_proj'\] selects no module"):
        lora.add_lora(model, ["q_proj"], r=2, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"selects '1', a LayerNorm; LoRA adapts Linear and Conv"):
        lora.add_lora(model, ["0", "1"], r=2, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"add_lora: `r` \(the rank\) must be a positive int"):
        lora.add_lora(model, ["0"], r=0, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="add_lora: `target_modules` must be a regular expression"):
        lora.add_lora(model, [0], r=2, alpha=2, key=jax.random.key(0))
    grouped = nn.Sequential([nn.Conv2d(4, 4, 3, groups=2, key=jax.random.key(0))])
    with pytest.raises(ValueError, match=r"the Conv at '0' has groups=2"):
        lora.add_lora(grouped, ["0"], r=2, alpha=2, key=jax.random.key(0))


def _saved(tmp_path: Any) -> tuple[Any, Any]:
    model = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
    tuned = lora.add_lora(model, ["0"], r=2, alpha=2, key=jax.random.key(1))
    lora.save_adapter(tuned, tmp_path)
    return model, tuned


def test_load_adapter_refuses_unsupported_config_values_by_name(tmp_path: Any) -> None:
    model, _ = _saved(tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    for key, value in [("use_dora", True), ("bias", "all"), ("rank_pattern", {"0": 4})]:
        (tmp_path / "adapter_config.json").write_text(json.dumps({**config, key: value}))
        with pytest.raises(tm.CheckpointError, match=rf"adapter_config.json sets {key}="):
            lora.load_adapter(model, tmp_path)
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(tm.CheckpointError, match="peft_type='IA3'"):
        lora.load_adapter(model, tmp_path)


def test_load_adapter_names_missing_and_unexpected_tensors(tmp_path: Any) -> None:
    from safetensors.numpy import load_file, save_file

    model, _ = _saved(tmp_path)
    file = tmp_path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    tensors["base_model.model.0.lora_C.weight"] = tensors.pop("base_model.model.0.lora_B.weight")
    save_file(tensors, str(file))
    with pytest.raises(tm.CheckpointError, match=r"missing \['0.lora_B.weight'\].*lora_C"):
        lora.load_adapter(model, tmp_path)
    file.unlink()
    with pytest.raises(tm.CheckpointError, match="adapter_model.safetensors does not exist"):
        lora.load_adapter(model, tmp_path)
    (tmp_path / "adapter_config.json").unlink()
    with pytest.raises(tm.CheckpointError, match="adapter_config.json does not exist"):
        lora.load_adapter(model, tmp_path)


def test_save_adapter_refuses_merged_and_plain_models(tmp_path: Any) -> None:
    model, tuned = _saved(tmp_path)
    with pytest.raises(ValueError, match=r"LoRA layers \['0'\] are merged.*unmerge"):
        lora.save_adapter(lora.merge(tuned, keep_adapters=True), tmp_path)
    with pytest.raises(ValueError, match="save_adapter: the model has no LoRA layers"):
        lora.save_adapter(model, tmp_path)
    two = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))] * 2)
    mixed = lora.add_lora(two, ["0"], r=2, alpha=2, key=jax.random.key(0))
    mixed = lora.add_lora(lora.unload(mixed), ["0"], r=2, alpha=2, key=jax.random.key(0))
    both = tm.tree_at(
        lambda m: m.layers[1],
        mixed,
        lora.add_lora(two, ["1"], r=3, alpha=2, key=jax.random.key(0)).layers[1],
    )
    with pytest.raises(ValueError, match=r"LoRA layers differ in r \(\['2', '3'\]\)"):
        lora.save_adapter(both, tmp_path)


def test_dropout_needs_a_key_in_training_and_matches_a_manual_mask() -> None:
    model = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0))])
    tuned = lora.add_lora(model, ["0"], r=2, alpha=2, dropout=0.5, key=jax.random.key(1))
    tuned = tm.tree_at(lambda m: m.layers[0].lora_B.weight, tuned, jnp.ones((4, 2)))
    x = jnp.ones((3, 4))
    with pytest.raises(
        ValueError, match=r"LoRALinear at layers\[0\]: lora_dropout=0.5 needs a key.*Pass `key=`"
    ):
        tuned.layers[0](x)
    layer = tuned.layers[0]
    key = jax.random.key(7)
    mask = np.asarray(nn.Dropout(0.5)(jnp.ones((3, 4)), key=key))  # the same draw, as values
    a, b = np.asarray(layer.lora_A.weight), np.asarray(layer.lora_B.weight)
    want = np.asarray(model.layers[0](x)) + ((np.asarray(x) * mask) @ a.T) @ b.T
    np.testing.assert_allclose(layer(x, key=key), want, rtol=1e-6)
    evaluated = nn.inference_mode(tuned).layers[0]
    np.testing.assert_allclose(
        evaluated(x), np.asarray(model.layers[0](x)) + (np.asarray(x) @ a.T) @ b.T, rtol=1e-6
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": float("nan")}, r"`alpha` \(lora_alpha\) must be a positive number; got nan"),
        ({"alpha": float("inf")}, r"`alpha` \(lora_alpha\) must be a positive number; got inf"),
        ({"alpha": -2.0}, r"`alpha` \(lora_alpha\) must be a positive number; got -2.0"),
        ({"alpha": 0}, r"`alpha` \(lora_alpha\) must be a positive number; got 0"),
        ({"alpha": "8"}, r"`alpha` \(lora_alpha\) must be a positive number; got '8' \(a str"),
        ({"alpha": True}, r"`alpha` \(lora_alpha\) must be a positive number; got True \(a bool"),
        ({"r": 0}, r"`r` \(the rank\) must be a positive int; got 0"),
        ({"r": -3}, r"`r` \(the rank\) must be a positive int; got -3"),
        ({"r": 2.0}, r"`r` \(the rank\) must be a positive int; got 2.0"),
        ({"r": True}, r"`r` \(the rank\) must be a positive int; got True"),
        ({"r": 10**9}, r"`r`=1000000000 is above the larger dimension \(4\) of the layer at '0'"),
        ({"r": 2**70}, r"`r`=1180591620717411303424 is above the larger dimension"),
        ({"dropout": float("nan")}, r"`dropout` \(lora_dropout\) must be in \[0, 1\]; got nan"),
        ({"dropout": 1.5}, r"`dropout` \(lora_dropout\) must be in \[0, 1\]; got 1.5"),
        ({"dropout": -0.1}, r"`dropout` \(lora_dropout\) must be in \[0, 1\]; got -0.1"),
        ({"dropout": "0.1"}, r"`dropout` \(lora_dropout\) must be in \[0, 1\]; got '0.1'"),
        ({"use_rslora": "yes"}, r"`use_rslora` must be a bool; got 'yes'"),
        ({"target_modules": "q_proj("}, r"`target_modules` 'q_proj\(' is not a regular expr"),
    ],
)
def test_add_lora_refuses_bad_hyperparameters_naming_them(
    kwargs: dict[str, Any], message: str
) -> None:
    model = nn.Sequential([nn.Linear(4, 3, key=jax.random.key(0))])
    args: dict[str, Any] = {"target_modules": ["0"], "r": 2, "alpha": 2, **kwargs}
    with pytest.raises(ValueError, match="add_lora: " + message):
        lora.add_lora(model, key=jax.random.key(0), **args)


def test_add_lora_accepts_numpy_numbers_and_writes_plain_json(tmp_path: Any) -> None:
    model = nn.Sequential([nn.Linear(4, 3, key=jax.random.key(0))])
    tuned = lora.add_lora(
        model, ["0"], r=np.int64(2), alpha=np.float32(3.0), dropout=np.float64(0.1),
        key=jax.random.key(0),
    )  # fmt: skip
    layer = tuned.layers[0]
    assert type(layer.r) is int and layer.r == 2 and layer.lora_alpha == 3.0
    lora.save_adapter(tuned, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (2, 3.0, 0.1)


def test_lora_layers_built_directly_check_their_values() -> None:
    base = nn.Linear(4, 3, key=jax.random.key(0))
    with pytest.raises(
        ValueError, match=r"LoRALinear: `lora_alpha` must be a finite positive .*nan"
    ):
        lora.LoRALinear.wrap(base, r=2, alpha=float("nan"), key=jax.random.key(1))
    with pytest.raises(ValueError, match=r"LoRALinear: `r` \(the rank\) must be a positive int"):
        dataclasses.replace(lora.LoRALinear.wrap(base, r=2, alpha=2, key=jax.random.key(1)), r=0)
    conv = nn.Conv2d(3, 4, 3, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"LoRAConv: `use_rslora` must be a bool; got 'no'"):
        lora.LoRAConv.wrap(conv, r=2, alpha=2, use_rslora="no", key=jax.random.key(1))  # type: ignore[arg-type]
