"""compressed-tensors `pack-quantized` checkpoints into `PackedLinear`: packed by
compressed-tensors' own `PackedQuantizationCompressor.compress`, dequantised bit for bit as its
`decompress`, and the logits as `transformers` computes them over the decompressed weights.
What treemod saves of the symmetric checkpoints is loaded by `transformers` itself (in a fresh
interpreter, as the other hub tests do: `hub_checks.transformers_outputs`); the asymmetric ones
it does not load (see the last test)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hub_checks import (
    assert_like_transformers,
    assert_refused,
    quantization_configs,
    transformers_outputs,
)

import treemod.quant as quant
from treemod.models import from_pretrained, save_pretrained

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ct = pytest.importorskip("compressed_tensors.quantization")
packing = pytest.importorskip("compressed_tensors.compressors.pack_quantized.base")

PROJ = {"self_attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "mlp": ["gate_proj", "up_proj", "down_proj"]}  # fmt: skip
IDS = np.array([[1, 5, 7, 9, 11, 3]])
CASES = {  # name: (bits, symmetric, strategy, scale dtype)
    "int4-asym-group": (4, False, "group", torch.float32),
    "int8-sym-channel": (8, True, "channel", torch.bfloat16),
    "int4-sym-group": (4, True, "group", torch.bfloat16),
}


def _build(name: str, root: Path) -> dict[str, Any]:
    bits, sym, strategy, dtype = CASES[name]
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    group = 32 if strategy == "group" else None
    args = ct.QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy,
                               group_size=group)  # fmt: skip
    scheme = ct.QuantizationScheme(targets=["Linear"], weights=args)
    top = 2 ** (bits - 1) - 1
    decompressed, exact = {}, {}
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                w = state.pop(f"{p}.weight").float()
                blocks = w.reshape(w.shape[0], -1, group or w.shape[1])
                scale = (blocks.abs().amax(-1) / top).to(dtype)
                local = {"weight": w, "weight_scale": scale}
                if not sym:
                    gen = torch.Generator().manual_seed(i)
                    local["weight_zero_point"] = torch.randint(-2, 3, scale.shape, generator=gen,
                                                               dtype=torch.int8)  # fmt: skip
                packed = packing.PackedQuantizationCompressor.compress(local, scheme)
                state |= {f"{p}.{k}": v for k, v in packed.items()}
                back = packing.PackedQuantizationCompressor.decompress(packed, scheme)
                decompressed[p] = back["weight"]
                # The same with the scales widened to float32: the exact products, which
                # treemod computes when the model is float32.
                wide = {**packed, "weight_scale": packed["weight_scale"].float()}
                exact[p] = packing.PackedQuantizationCompressor.decompress(wide, scheme)["weight"]
    model.config.save_pretrained(root)
    safetensors_torch.save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    qconfig = ct.QuantizationConfig(
        config_groups={"group_0": scheme}, format="pack-quantized", ignore=["lm_head"],
        quantization_status=ct.QuantizationStatus.COMPRESSED,
    )  # fmt: skip
    config_json = json.loads((root / "config.json").read_text())
    config_json["architectures"] = ["LlamaForCausalLM"]
    config_json["quantization_config"] = qconfig.model_dump(mode="json")
    (root / "config.json").write_text(json.dumps(config_json))
    float_model = transformers.LlamaForCausalLM(config)
    plain = {k: v.float() for k, v in state.items() if k.endswith(("weight", "bias"))}
    float_model.load_state_dict({**plain, **{f"{p}.weight": w for p, w in exact.items()}})
    return {"path": root, "decompressed": decompressed, "dtype": dtype, "float": float_model}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {name: _build(name, tmp_path_factory.mktemp(name)) for name in CASES}


@pytest.fixture(params=list(CASES))
def checkpoint(request: Any, checkpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": request.param, **checkpoints[request.param]}


def _layer(model: Any, i: int, part: str, proj: str) -> Any:
    layer = getattr(getattr(model.model.layers.layers, part), proj)
    return type(layer)(**{k: (v[i] if hasattr(v, "shape") else v) for k, v in vars(layer).items()})


def test_packed_layers_hold_the_stored_arrays_and_dequantise_as_compressed_tensors(
    checkpoint: dict[str, Any],
) -> None:
    model = from_pretrained(checkpoint["path"])  # the checkpoint's dtype, the scales'
    stored = safetensors_torch.load_file(checkpoint["path"] / "model.safetensors")
    assert type(model.lm_head).__name__ == "Linear"
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                layer = _layer(model, i, part, proj)
                assert type(layer) is quant.PackedLinear
                assert np.array_equal(np.asarray(layer.weight_packed),
                                      stored[f"{p}.weight_packed"].numpy())  # fmt: skip
                got = np.asarray(layer.dequantised_weight().astype(jnp.float32))
                want = checkpoint["decompressed"][p]
                assert want.dtype == checkpoint["dtype"]
                # bfloat16 widens to float32 exactly: equal float32 bits are equal bfloat16 ones
                want_bits = want.float().numpy().view(np.uint32)
                assert np.array_equal(got.view(np.uint32), want_bits), p


def test_packed_logits_equal_transformers_over_the_decompressed_weights(
    checkpoint: dict[str, Any],
) -> None:
    # transformers 5.24's own compressed-tensors loader mis-shapes packed asymmetric zero
    # points (it expects them unpacked), so the reference is its float Llama holding
    # compressed-tensors' `decompress`ed weights.
    with torch.no_grad():
        want = checkpoint["float"].eval()(torch.tensor(IDS)).logits.float().numpy()
    model = from_pretrained(checkpoint["path"], dtype=jnp.float32)
    got = np.asarray(model(input_ids=jnp.asarray(IDS)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_packed_options_treemod_does_not_read_are_refused_by_name(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    src = checkpoint["path"]
    weights = "quantization_config.config_groups.group_0"
    for i, (change, word) in enumerate([
        ({"format": "float-quantized"}, "quantization_config.format='float-quantized'"),
        ({"quantization_status": "frozen"}, "quantization_status='frozen'"),
        ({"weights": {"type": "float", "num_bits": 8}}, f"{weights}.weights.type='float'"),
        ({"weights": {"type": "int", "num_bits": 2, "strategy": "group"}},
         f"{weights}.weights.num_bits=2"),
        ({"input_activations": {"num_bits": 8}}, f"{weights}.input_activations="),
    ]):  # fmt: skip
        top = set(change) <= {"format", "quantization_status"}
        group = (lambda q: q) if top else (lambda q: q["config_groups"]["group_0"])
        assert_refused(src, tmp_path / str(i), lambda q, c=change, g=group: g(q).update(c), word)


def test_packed_checkpoints_save_back_byte_for_byte(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    save_pretrained(from_pretrained(checkpoint["path"]), tmp_path)
    ours, theirs = quantization_configs(tmp_path, checkpoint["path"])
    assert ours == theirs


@pytest.fixture(scope="module")
def reference(
    checkpoints: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """`transformers`' float32 logits and first `q_proj` for what treemod saves of each
    symmetric checkpoint (loaded and saved again)."""
    dirs = {}
    for name, entry in checkpoints.items():
        if CASES[name][1]:
            dirs[name] = tmp_path_factory.mktemp(f"saved-{name}")
            save_pretrained(from_pretrained(entry["path"]), dirs[name])
    out = transformers_outputs(dirs, IDS, tmp_path_factory.mktemp("transformers"), "float32")
    return {"dirs": dirs, "out": out}


@pytest.mark.heavy
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[1]])
def test_transformers_loads_the_symmetric_checkpoints_treemod_saves(
    name: str, reference: dict[str, Any]
) -> None:
    # transformers 5.24 decompresses them into float Linears on loading (its CPU path), so the
    # weights and float32 logits agree to summation order. It does not load the asymmetric
    # ones, which treemod saves as compressed-tensors writes them: it expects the packed
    # weight_zero_point unpacked, (out, groups) where the file holds (out * bits / 32, groups),
    # and stops ("ignore_mismatched_sizes").
    out, directory = reference["out"], reference["dirs"][name]
    assert_like_transformers(out, name, directory, IDS, "Linear", "float32")
