"""Quantised models: the compiled matmul's memory, `dequantise`, `Stack`s, errors by name, and
QLoRA against PEFT over the dequantised base."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn
import treemod.quant as quant

sys.path.insert(0, str(Path(__file__).parents[1] / "lora"))
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("scheme", ["int8", "nf4", "int4"])
def test_the_compiled_matmul_never_holds_the_whole_float_weight(scheme: str) -> None:
    model = nn.Sequential([nn.Linear(1024, 1024, key=jax.random.key(0))])
    q = quant.quantise(model, ["0"], scheme)
    x = jnp.ones((4, 1024))
    float_bytes = 1024 * 1024 * 4

    def loss(x: Any, m: Any) -> Any:
        return jnp.sum(m(x) ** 2)

    for fn in (lambda m, x: m(x), lambda m, x: jax.grad(loss)(x, m)):
        stats = jax.jit(fn).lower(q, x).compile().memory_analysis()
        assert stats.temp_size_in_bytes < float_bytes / 4, (scheme, stats.temp_size_in_bytes)
    # Without the slices XLA's CPU code dequantises the whole weight into a temporary.
    whole = jax.jit(lambda m, x: x @ m.layers[0].dequantised_weight().T).lower(q, x).compile()
    assert whole.memory_analysis().temp_size_in_bytes >= float_bytes


def _block_stack() -> nn.Stack:
    return nn.Stack(lambda k: nn.MLP(64, 64, 128, 1, key=k), 3, key=jax.random.key(0))


@pytest.mark.parametrize("scheme", ["int8", "nf4", "int4"])
def test_stacks_quantise_per_layer_and_dequantise_back(scheme: str) -> None:
    stack = _block_stack()
    q = quant.quantise(stack, r"\d+\.layers\.\d+", scheme, group_size=32)
    x = jax.random.normal(jax.random.key(1), (5, 64))
    back = quant.dequantise(q)
    assert type(back.layers.layers[0]) is nn.Linear
    # The float model holds exactly the dequantised weights of each layer, one by one.
    for i in range(3):
        for j in range(2):
            want = q[i].layers[j].dequantised_weight()
            np.testing.assert_array_equal(np.asarray(back[i].layers[j].weight), np.asarray(want))
    np.testing.assert_allclose(np.asarray(q(x)), np.asarray(back(x)), rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(q(x) - stack(x)))) < 0.2 * float(jnp.max(jnp.abs(stack(x))))


def test_errors_name_the_layer_and_the_option() -> None:
    mlp = nn.Sequential([nn.Linear(6, 3, key=jax.random.key(0)), nn.Lambda(jax.nn.relu)])
    with pytest.raises(ValueError, match=r"selects no module"):
        quant.quantise(mlp, ["q_proj"])
    with pytest.raises(ValueError, match=r"'1', a Lambda"):
        quant.quantise(mlp, ["0", "1"])
    with pytest.raises(ValueError, match=r"'0'.*odd count"):
        quant.quantise(nn.Sequential([nn.Linear(3, 3, key=jax.random.key(0))]), ["0"])
    with pytest.raises(ValueError, match=r"'0'.*odd count; FP4 packs two a byte"):
        quant.quantise(nn.Sequential([nn.Linear(3, 3, key=jax.random.key(0))]), ["0"], "fp4")
    with pytest.raises(ValueError, match=r"`block_size`.*got 48"):
        quant.quantise(mlp, ["0"], "fp4", block_size=48)
    with pytest.raises(ValueError, match=r"'0'.*in_features=6.*group_size=4"):
        quant.quantise(mlp, ["0"], "int4", group_size=4)
    with pytest.raises(ValueError, match=r"`block_size`.*got 48"):
        quant.quantise(mlp, ["0"], block_size=48)
    with pytest.raises(ValueError, match=r"`scheme`.*'fp8'"):
        quant.quantise(mlp, ["0"], "fp8")  # type: ignore[arg-type]
    q = quant.quantise(mlp, ["0"], "int8")
    with pytest.raises(ValueError, match=r"'0' is already quantised"):
        quant.quantise(q, ["0"], "int8")
    with pytest.raises(ValueError, match=r"Int8Linear: the input's last axis.*in_features=6"):
        q(jnp.ones(5))
    tuned = lora.add_lora(q, ["0"], r=2, alpha=2, key=jax.random.key(1))
    with pytest.raises(ValueError, match=r"Int8Linear.*int8.*dequantise"):
        lora.merge(tuned)


peft_reference = pytest.importorskip("peft_reference")


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_qlora_trains_only_adapters_and_loads_into_peft_over_the_dequantised_base(
    tmp_path: Path,
) -> None:
    import peft
    import torch

    hf, model = peft_reference.pair("llama")
    base = quant.quantise(model, ALL_LINEAR, "nf4", block_size=32)
    tuned = peft_reference.randomise_b(
        lora.add_lora(base, ALL_LINEAR, r=4, alpha=8, key=jax.random.key(3))
    )
    ids = peft_reference.IDS
    adapters, frozen = tm.partition(tuned, lora.trainable(tuned))

    def loss(adapters: Any, frozen: Any) -> Any:
        logits = tm.combine(adapters, frozen)(input_ids=ids)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    grads = tm.filter_jit(tm.filter_grad(loss))(adapters, frozen)
    # Only adapter arrays are differentiated; the packed base never reaches the gradient.
    assert {x.dtype for x in jax.tree_util.tree_leaves(grads)} == {jnp.dtype("float32")}
    assert len(jax.tree_util.tree_leaves(grads)) == 2 * len(ALL_LINEAR)

    lora.save_adapter(tuned, tmp_path)
    float_base = tm.state_dict(quant.dequantise(base))
    hf.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in float_base.items()},
                       strict=False)  # fmt: skip
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path), is_trainable=True)
    logits = reference(input_ids=torch.from_numpy(ids)).logits
    want_loss = torch.log_softmax(logits, -1)[..., 0].mean()
    want_loss.backward()
    got = tm.filter_jit(lambda m, x: m(input_ids=x))(tuned, ids)
    assert peft_reference.relative_error(got, logits.detach().numpy()) <= 1e-5
    # The adapters' gradients equal PyTorch's through PEFT over the same (dequantised) base.
    zeros = jax.tree_util.tree_map(lambda x: jnp.zeros_like(x) if tm.is_array(x) else x, frozen)
    names = tm.state_dict(tm.combine(grads, zeros))
    for name, p in reference.named_parameters():
        if "lora_" in name:
            key = name.removeprefix("base_model.model.").replace(".default", "")
            np.testing.assert_allclose(names[key], p.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_quantised_head_is_not_trained_or_saved_whole(tmp_path: Path) -> None:
    from treemod.models.bert import BertForSequenceClassification

    config = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_labels": 2}  # fmt: skip
    model = BertForSequenceClassification.from_config(config, key=jax.random.key(0))
    q = quant.quantise(model, ["query", "classifier"], "nf4", block_size=32)
    tuned = lora.add_lora(q, ["query"], r=2, alpha=4, key=jax.random.key(1))
    # A SEQ_CLS model trains its head whole by default (PEFT's modules_to_save): refused when
    # the head is quantised, whose only float arrays are its scales.
    for call, caller in [(lambda: lora.trainable(tuned), "trainable"),
                         (lambda: lora.save_adapter(tuned, tmp_path), "save_adapter"),
                         (lambda: lora.trainable(tuned, ["classifier"]), "trainable")]:  # fmt: skip
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        for word in [f"{caller}:", "'classifier'", "NF4Linear", "llm_int8_skip_modules"]:
            assert word in message, (word, message)
    # Adapters only: the spec marks every LoRA array and nothing of the quantised head.
    adapters, _ = tm.partition(tuned, lora.trainable(tuned, []))
    assert adapters.classifier.absmax is None and adapters.classifier.nested_absmax is None
    lora.save_adapter(tuned, tmp_path, modules_to_save=[], task_type="FEATURE_EXTRACTION")
