"""LoRA against PEFT on tiny `transformers` models (Llama: `model.layers` is an `nn.Stack`;
GPT-2: `Conv1D` with PEFT's `fan_in_fan_out`): adapter files both ways, equal outputs."""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
from peft_reference import (
    IDS,
    hf_logits,
    pair,
    peft_model,
    randomise_b,
    randomise_peft_b,
    relative_error,
)

import treemod as tm
import treemod.lora as lora

RTOL = 1e-5
# peft 0.21 reads a property that transformers 5 deprecates; neither is ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)
CASES = [
    ("llama", ["q_proj", "v_proj"], {}),
    ("llama", r"model\.layers\.\d+\.mlp\.(gate|down)_proj", {}),
    ("llama", ["self_attn.o_proj", "up_proj"], {"use_rslora": True}),
    ("gpt2", ["c_attn"], {}),
    ("gpt2", r".*\.(c_proj|c_fc)", {"use_rslora": True}),
]


@pytest.mark.parametrize(("family", "targets", "extra"), CASES)
def test_peft_adapter_loads_into_treemod(
    family: str, targets: Any, extra: dict[str, Any], tmp_path: Any
) -> None:
    hf, model = pair(family)
    fan = {"fan_in_fan_out": True} if family == "gpt2" else {}
    reference = peft_model(hf, targets, 4, 8, **fan, **extra)
    randomise_peft_b(reference)
    reference.save_pretrained(tmp_path)
    tuned = lora.load_adapter(model, tmp_path)
    want = hf_logits(reference, IDS)
    assert relative_error(tm.filter_jit(lambda m, x: m(input_ids=x))(tuned, IDS), want) <= RTOL
    # The adapters changed the output (B is non-zero), so the comparison tested them.
    assert relative_error(model(input_ids=IDS), want) > 1e-3


@pytest.mark.parametrize(("family", "targets", "extra"), CASES)
def test_treemod_adapter_loads_into_peft(
    family: str, targets: Any, extra: dict[str, Any], tmp_path: Any
) -> None:
    hf, model = pair(family)
    tuned = lora.add_lora(model, targets, r=4, alpha=8, key=jax.random.key(3), **extra)
    tuned = randomise_b(tuned)
    lora.save_adapter(tuned, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["peft_type"] == "LORA"
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    loaded = sum("lora_B" in n for n, _ in reference.named_parameters())
    assert loaded == sum(".lora_B." in n for n in tm.state_dict(tuned)) > 0
    want = hf_logits(reference, IDS)
    assert relative_error(tuned(input_ids=IDS), want) <= RTOL
    assert relative_error(model(input_ids=IDS), want) > 1e-3


def test_new_adapters_leave_outputs_unchanged_and_a_is_kaiming_uniform() -> None:
    hf, model = pair("llama")
    tuned = lora.add_lora(model, ["q_proj", "k_proj"], r=8, alpha=16, key=jax.random.key(0))
    np.testing.assert_allclose(tuned(input_ids=IDS), model(input_ids=IDS), rtol=0, atol=0)
    a = np.asarray(tuned.model.layers.layers.self_attn.q_proj.lora_A.weight)
    assert a.shape == (2, 8, 32)  # the Stack's layer axis in front
    bound = 1 / np.sqrt(32)  # kaiming_uniform(a=sqrt(5)) on fan_in 32, as PEFT
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.9 * bound
    assert not np.array_equal(a[0], a[1])  # each layer its own draw
    reference = peft_model(hf, ["q_proj"], 8, 16)
    peft_a = reference.base_model.model.model.layers[0].self_attn.q_proj.lora_A.default.weight
    assert float(peft_a.detach().abs().max()) <= bound


def test_merge_matches_peft_merge_and_unload() -> None:
    hf, model = pair("llama")
    reference = peft_model(hf, ["q_proj", "down_proj"], 4, 8)
    randomise_peft_b(reference)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        reference.save_pretrained(d)
        tuned = lora.load_adapter(model, d)
    merged_hf = reference.merge_and_unload()
    state = {k: v.detach().numpy() for k, v in merged_hf.state_dict().items()}
    merged = tm.state_dict(lora.merge(tuned))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        np.testing.assert_allclose(merged[name], state[name], rtol=1e-6, atol=1e-6)
    assert set(merged) == set(state) - set(model.tied_weights())


def test_merge_then_unmerge_restores_the_weights() -> None:
    _, model = pair("gpt2")
    tuned = lora.add_lora(model, ["c_attn", "c_fc"], r=4, alpha=8, key=jax.random.key(0))
    tuned = tm.tree_at(
        lambda m: m.transformer.h.layers.attn.c_attn.lora_B.weight,
        tuned,
        jax.random.normal(jax.random.key(1), (2, 96, 4)),
    )
    merged = lora.merge(tuned, keep_adapters=True)
    before, after = tm.state_dict(tuned), tm.state_dict(merged)
    name = "transformer.h.1.attn.c_attn.base_layer.weight"
    assert np.abs(after[name] - before[name]).max() > 1e-2  # the update went in
    np.testing.assert_allclose(merged(input_ids=IDS), tuned(input_ids=IDS), rtol=1e-5, atol=1e-5)
    restored = tm.state_dict(lora.unmerge(merged))
    for k in before:
        np.testing.assert_allclose(restored[k], before[k], rtol=0, atol=1e-6)
    plain = lora.unload(lora.merge(tuned, keep_adapters=True))
    assert tm.tree_equal(tm.state_dict(plain), tm.state_dict(model), rtol=0, atol=1e-6)


def test_gradients_reach_only_the_adapters() -> None:
    _, model = pair("llama")
    tuned = lora.add_lora(model, ["q_proj", "v_proj"], r=4, alpha=8, key=jax.random.key(0))
    tuned = randomise_b(tuned)  # with B = 0, A's gradient is zero too
    adapters, frozen = tm.partition(tuned, lora.trainable(tuned))

    @tm.filter_grad
    def grad(adapters: Any, frozen: Any) -> Any:
        logits = tm.combine(adapters, frozen)(input_ids=IDS)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    g = grad(adapters, frozen)
    zeros = jax.tree_util.tree_map(lambda x: jnp.zeros_like(x) if tm.is_array(x) else x, frozen)
    names = tm.state_dict(tm.combine(g, zeros))
    lora_names = [n for n in names if ".lora_" in n]
    assert len(lora_names) == 8
    assert all(np.abs(names[n]).max() > 0 for n in lora_names), lora_names
    assert all(np.abs(v).max() == 0 for n, v in names.items() if ".lora_" not in n)
    # Only the adapters are differentiated: the frozen half never reaches the gradient.
    assert {x.shape for x in jax.tree_util.tree_leaves(g)} == {(2, 4, 32), (2, 32, 4), (2, 16, 4)}


def test_save_adapter_writes_peft_names_and_config(tmp_path: Any) -> None:
    _, model = pair("llama")
    tuned = lora.add_lora(model, ["v_proj"], r=2, alpha=4, key=jax.random.key(0))
    lora.save_adapter(tuned, tmp_path, base_model_name_or_path="tiny-llama")
    from safetensors.numpy import load_file

    names = sorted(load_file(str(tmp_path / "adapter_model.safetensors")))
    assert names == [
        f"base_model.model.model.layers.{i}.self_attn.v_proj.lora_{ab}.weight"
        for i in (0, 1)
        for ab in "AB"
    ]
    config = peft.LoraConfig.from_pretrained(str(tmp_path))
    assert config.base_model_name_or_path == "tiny-llama" and config.r == 2


def test_torch_module_with_conv_and_linear_matches_peft(tmp_path: Any) -> None:
    import treemod.nn as nn

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1)
            self.head = torch.nn.Linear(6 * 4 * 4, 5)

        def forward(self, x: Any) -> Any:
            return self.head(torch.relu(self.conv(x)).flatten(1))

    class TmNet(tm.Module):
        conv: nn.Conv2d
        head: nn.Linear

        def __call__(self, x: Any) -> Any:
            y = jax.nn.relu(self.conv(x))
            return self.head(y.reshape(y.shape[0], -1))

    net = Net().eval()
    twin = TmNet(
        nn.Conv2d(3, 6, 3, stride=2, padding=1, key=jax.random.key(0)),
        nn.Linear(96, 5, key=jax.random.key(1)),
    )
    twin = tm.load_state_dict(twin, {k: v.numpy() for k, v in net.state_dict().items()})
    reference = peft_model(net, ["conv", "head"], 3, 6)
    randomise_peft_b(reference)
    reference.save_pretrained(tmp_path)
    tuned = lora.load_adapter(twin, tmp_path)
    assert type(tuned.conv).__name__ == "LoRAConv"
    x = np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32)
    with torch.no_grad():
        want = reference(torch.from_numpy(x)).numpy()
    x = jnp.asarray(x)
    assert relative_error(tuned(x), want) <= RTOL
    merged = lora.merge(tuned)
    assert type(merged.conv).__name__ == "Conv2d"
    assert relative_error(merged(x), want) <= RTOL


@pytest.mark.parametrize("extra", [{}, {"use_rslora": True}])
def test_loading_into_adapters_of_another_alpha_takes_the_files_as_peft(
    extra: dict[str, Any], tmp_path: Any
) -> None:
    hf, model = pair("llama")
    reference = peft_model(hf, ["q_proj", "v_proj"], 4, 8, **extra)
    randomise_peft_b(reference)
    reference.save_pretrained(tmp_path)
    # Adapters of the same rank and modules, but another alpha and the other rslora setting.
    other = lora.add_lora(
        model, ["q_proj", "v_proj"], r=4, alpha=32, use_rslora=not extra, key=jax.random.key(5)
    )
    tuned = lora.load_adapter(other, tmp_path)
    layer = tuned.model.layers.layers.self_attn.q_proj
    assert (layer.lora_alpha, layer.use_rslora) == (8, bool(extra))
    assert relative_error(tuned(input_ids=IDS), hf_logits(reference, IDS)) <= RTOL


def test_loading_another_rank_names_only_the_adapter_tensors(tmp_path: Any) -> None:
    hf, model = pair("llama")
    reference = peft_model(hf, ["q_proj", "v_proj"], 4, 8)
    reference.save_pretrained(tmp_path)
    other = lora.add_lora(model, ["q_proj", "v_proj"], r=2, alpha=8, key=jax.random.key(5))
    with pytest.raises(tm.CheckpointError) as info:
        lora.load_adapter(other, tmp_path)
    message = str(info.value)
    assert "the file's rank is 4, the model's 2" in message
    assert (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight: the file has [4, 32], "
        "the model's adapter needs [2, 32]"
    ) in message
    assert "missing" not in message and "base_layer" not in message and "embed" not in message


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_auto_peft_model_loads_the_adapter_with_its_task_type(family: str, tmp_path: Any) -> None:
    hf, model = pair(family)
    hf.save_pretrained(tmp_path / "base")
    targets = ["q_proj", "v_proj"] if family == "llama" else ["c_attn"]
    tuned = randomise_b(lora.add_lora(model, targets, r=4, alpha=8, key=jax.random.key(3)))
    lora.save_adapter(tuned, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM"
    reference = peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
    assert isinstance(reference, peft.PeftModelForCausalLM)
    assert relative_error(tuned(input_ids=IDS), hf_logits(reference, IDS)) <= RTOL


def test_an_adapter_with_dropout_loads_in_inference_mode_as_peft(tmp_path: Any) -> None:
    hf, model = pair("llama")
    reference = peft_model(hf, ["q_proj", "v_proj"], 4, 8, lora_dropout=0.05)
    randomise_peft_b(reference)
    reference.save_pretrained(tmp_path)
    tuned = lora.load_adapter(model, tmp_path)  # called without a key: dropout is off
    assert relative_error(tuned(input_ids=IDS), hf_logits(reference, IDS)) <= RTOL
    trainable = lora.load_adapter(model, tmp_path, is_trainable=True)
    layer = trainable.model.layers.layers.self_attn.q_proj
    assert layer.lora_dropout.p == 0.05 and not layer.lora_dropout.inference
    with pytest.raises(ValueError, match="lora_dropout=0.05 needs a key in training mode"):
        trainable(input_ids=IDS)
