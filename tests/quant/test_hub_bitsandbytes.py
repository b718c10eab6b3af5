"""bitsandbytes checkpoints (NF4, FP4, int8) as transformers writes them, in and out: written by
transformers with
bitsandbytes' CPU backend (`BitsAndBytesConfig`, `save_pretrained`) from a small random Llama,
loaded by `from_pretrained` into treemod's quantised layers with the stored arrays as they are
(dequantised bit for bit as `bitsandbytes.functional` dequantises them), and written back by
`save_pretrained` in the layout transformers loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hub_checks import quantization_configs, with_config
from lora.lora_arrays import randomise_b

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn
import treemod.quant as quant
from treemod import CheckpointError
from treemod.models import from_pretrained, save_pretrained

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
F = pytest.importorskip("bitsandbytes.functional")
safetensors_torch = pytest.importorskip("safetensors.torch")

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = np.array([[1, 5, 7, 9, 11, 3]])
SCHEMES = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False),
    "nf4-double": dict(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True
    ),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False),
    "fp4-double": dict(
        load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=True
    ),
    "int8": dict(load_in_8bit=True),
}


def _bits(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A float Llama and its bitsandbytes checkpoints, all written by transformers."""
    root = tmp_path_factory.mktemp("hub")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(root / "float")
    out = {"float": root / "float"}
    for name, options in SCHEMES.items():
        model = _reference(root / "float", transformers.BitsAndBytesConfig(**options))
        model.save_pretrained(root / name)
        out[name] = root / name
    return out


def _reference(directory: Path, quantization: Any = None) -> Any:
    return transformers.LlamaForCausalLM.from_pretrained(
        directory, quantization_config=quantization, dtype=torch.float32, device_map="cpu"
    )


def _bnb_dequantised(module: Any) -> np.ndarray:
    """bitsandbytes' own dequantisation of a transformers `Linear4bit` / `Linear8bitLt`."""
    w = module.weight
    if hasattr(w, "quant_state"):
        return F.dequantize_4bit(w.data, w.quant_state).float().numpy()
    return F.int8_vectorwise_dequant(w.data, w.SCB).float().numpy()


def _float_reference(torch_model: Any) -> Any:
    """A float transformers Llama holding bitsandbytes' dequantised weights of `torch_model`."""
    model = transformers.LlamaForCausalLM(torch_model.config).float()
    state = {}
    for name, module in torch_model.named_modules():
        if hasattr(module, "weight") and module.weight is not None:
            w = module.weight
            plain = w.dtype.is_floating_point and not hasattr(w, "quant_state")
            state[f"{name}.weight"] = (
                w.data if plain else torch.from_numpy(_bnb_dequantised(module))
            )
    model.load_state_dict(state, strict=False)
    return model.eval()


def _logits(model: Any) -> np.ndarray:
    if isinstance(model, torch.nn.Module):
        with torch.no_grad():
            return model(torch.tensor(IDS)).logits.float().numpy()
    return np.asarray(model(input_ids=jnp.asarray(IDS)))


def _layer(model: Any, i: int, proj: str) -> Any:
    """Layer `i`'s projection of a treemod Llama (its layers are a `Stack`)."""
    stacked = model.model.layers.layers
    part = stacked.self_attn if proj.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else (
        stacked.mlp)  # fmt: skip
    layer = getattr(part, proj)
    return type(layer)(**{
        k: (v[i] if hasattr(v, "shape") else v) for k, v in vars(layer).items()
    })  # fmt: skip


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_loads_the_stored_arrays_and_dequantises_as_bitsandbytes(
    hub: dict[str, Path], scheme: str
) -> None:
    model = from_pretrained(hub[scheme])
    reference = _reference(hub[scheme])
    stored = safetensors_torch.load_file(hub[scheme] / "model.safetensors")
    want_cls = quant.Int8Linear if scheme == "int8" else quant.NF4Linear
    assert type(model.lm_head).__name__ == "Linear"  # not converted, as transformers does
    for i in range(2):
        for proj in PROJ:
            ours = _layer(model, i, proj)
            assert type(ours) is want_cls
            if scheme != "int8":
                assert ours.quant_type == scheme[:3]
            section = "self_attn" if proj in PROJ[:4] else "mlp"
            name = f"model.layers.{i}.{section}.{proj}"
            # The packed arrays are the file's, as they are.
            file_weight = stored[f"{name}.weight"].numpy()
            flat = file_weight if scheme == "int8" else file_weight.ravel()
            assert np.array_equal(np.asarray(ours.weight), flat)
            theirs = _bnb_dequantised(reference.get_submodule(name))
            got = np.asarray(ours.dequantised_weight())
            assert np.array_equal(_bits(got), _bits(theirs)), name
    # Logits against transformers' float Llama holding bitsandbytes' dequantised weights.
    np.testing.assert_allclose(
        _logits(model), _logits(_float_reference(reference)), rtol=1e-4, atol=1e-5
    )
    # And against bitsandbytes' own quantised model, within its activation rounding (LLM.int8
    # quantises the inputs too; its CPU 4-bit matmul is not float32-exact).
    np.testing.assert_allclose(_logits(model), _logits(reference), atol=1e-2)


def _headers(directory: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    tensors = safetensors_torch.load_file(directory / "model.safetensors")
    return {k: (str(v.dtype), tuple(v.shape)) for k, v in tensors.items()}


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_loaded_checkpoints_save_back_byte_for_byte(
    hub: dict[str, Path], scheme: str, tmp_path: Path
) -> None:
    save_pretrained(from_pretrained(hub[scheme]), tmp_path)
    config, want = quantization_configs(tmp_path, hub[scheme])
    assert config.pop("llm_int8_skip_modules") == ["lm_head"]
    assert want.pop("llm_int8_skip_modules") is None  # transformers' default leaves lm_head
    assert config == want


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_treemod_quantised_models_save_what_transformers_loads(
    hub: dict[str, Path], scheme: str, tmp_path: Path
) -> None:
    float_model = from_pretrained(hub["float"])
    double = scheme.endswith("-double")
    model = quant.quantise(float_model, PROJ, scheme.split("-")[0], double_quant=double)
    save_pretrained(model, tmp_path)
    ours, theirs = _headers(tmp_path), _headers(hub[scheme])
    if double:  # the JSON state's length follows the offset's printed digits
        ours, theirs = ({k: (d, s if "quant_state" not in k else ()) for k, (d, s) in h.items()}
                        for h in (ours, theirs))  # fmt: skip
    assert ours == theirs  # transformers' names, dtypes and shapes
    # 4-bit without double quantisation is bitsandbytes' quantiser bit for bit: transformers'
    # very bytes. (Its int8 path rounds the weights to float16 before quantising them.)
    if scheme in ("nf4", "fp4"):
        theirs = safetensors_torch.load_file(hub[scheme] / "model.safetensors")
        ours = safetensors_torch.load_file(tmp_path / "model.safetensors")
        for name, value in theirs.items():
            assert torch.equal(ours[name].view(torch.uint8), value.view(torch.uint8)), name
    loaded = _reference(tmp_path)
    for i in range(2):
        for proj in PROJ:
            section = "self_attn" if proj in PROJ[:4] else "mlp"
            module = loaded.get_submodule(f"model.layers.{i}.{section}.{proj}")
            assert type(module).__name__ in ("Linear4bit", "Linear8bitLt")
            got = np.asarray(_layer(model, i, proj).dequantised_weight())
            assert np.array_equal(_bits(got), _bits(_bnb_dequantised(module)))
    np.testing.assert_allclose(
        _logits(model), _logits(_float_reference(loaded)), rtol=1e-4, atol=1e-5
    )


def test_unsupported_methods_and_options_are_refused_by_name(
    hub: dict[str, Path], tmp_path: Path
) -> None:
    for i, (change, words) in enumerate([
        ({"quant_method": "hqq"}, ["quant_method='hqq'", "'bitsandbytes'", "'gptq'", "'awq'",
                                    "'compressed-tensors'"]),
        ({"bnb_4bit_quant_type": "af4"}, ["bnb_4bit_quant_type='af4'", "'nf4'", "'fp4'"]),
        # The config's 4-bit type and the layers' states must agree.
        ({"bnb_4bit_quant_type": "fp4"}, ["bitsandbytes__nf4 is a 'nf4' state",
                                          "bnb_4bit_quant_type is 'fp4'"]),
        ({"bnb_4bit_quant_storage": "bfloat16"}, ["bnb_4bit_quant_storage='bfloat16'"]),
        ({"load_in_8bit": True}, ["load_in_4bit=True and load_in_8bit=True"]),
    ]):  # fmt: skip
        directory = with_config(hub["nf4"], tmp_path / str(i), lambda q, c=change: q.update(c))
        with pytest.raises(CheckpointError) as info:
            from_pretrained(directory)
        for word in [str(directory / "config.json"), *words]:
            assert word in str(info.value)
    # A model dequantised again saves as a float checkpoint (no quantization_config).
    back = quant.dequantise(from_pretrained(hub["int8"]))
    assert isinstance(back.model.layers.layers.self_attn.q_proj, nn.Linear)
    save_pretrained(back, tmp_path / "float")
    assert "quantization_config" not in json.loads((tmp_path / "float/config.json").read_text())


def _adapted(base: Any) -> Any:
    """`base` with LoRA on `PROJ` and a random B (it starts at zero, which would leave A's
    gradients zero)."""
    return randomise_b(lora.add_lora(base, PROJ, r=4, alpha=8, key=jax.random.key(3)))


def _adapter_grads(tuned: Any) -> list[Any]:
    adapters, frozen = tm.partition(tuned, lora.trainable(tuned))

    def loss(adapters: Any, frozen: Any) -> Any:
        logits = tm.combine(adapters, frozen)(input_ids=jnp.asarray(IDS))
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    return jax.tree_util.tree_leaves(tm.filter_jit(tm.filter_grad(loss))(adapters, frozen))


def test_qlora_over_an_fp4_base_trains_only_the_adapters(hub: dict[str, Path]) -> None:
    base = from_pretrained(hub["fp4"])
    grads = _adapter_grads(_adapted(base))
    # Only the adapters are differentiated (float32 A and B of each projection), never the
    # packed base; they equal the gradients over bitsandbytes' dequantised float weights.
    assert {x.dtype for x in grads} == {jnp.dtype("float32")}
    assert len(grads) == 2 * len(PROJ)
    want = _adapter_grads(_adapted(quant.dequantise(base)))
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-7)


def test_nf4_and_fp4_layers_in_one_model_are_refused_on_save(
    hub: dict[str, Path], tmp_path: Path
) -> None:
    model = from_pretrained(hub["fp4"])
    model = tm.tree_at(
        lambda m: m.lm_head, model, quant.quantise(model, ["lm_head"], "nf4").lm_head
    )
    with pytest.raises(ValueError, match=r"NF4Linear layers of quant_type \['fp4', 'nf4'\]"):
        save_pretrained(model, tmp_path)
