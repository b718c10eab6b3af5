"""AWQ checkpoints (4-bit, `version: "gemm"`) into `AWQLinear`, against the format's
definition: packed as AutoAWQ's `WQLinear_GEMM.from_linear` (awq/modules/linear/gemm.py) packs
(read, not copied: the levels of the transposed weight eight to an int32 along the output axis,
column `8c + [0, 2, 4, 6, 1, 3, 5, 7][i]` in bits `4i`; the zero points alike), and dequantised
as its `dequantize_gemm` (awq/utils/packing_utils.py), `(q - zero) * scale` in float16. What
treemod saves is loaded by `transformers` with GPT-QModel's torch AWQ kernel (in a fresh
interpreter: `hub_checks.transformers_outputs`), whose dequantised weights and float16 logits
it is compared with."""

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

PROJ = {"self_attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "mlp": ["gate_proj", "up_proj", "down_proj"]}  # fmt: skip
GROUP = 32
ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
IDS = np.array([[1, 5, 7, 9, 11, 3]])


def _pack(levels: np.ndarray) -> np.ndarray:
    """`(rows, cols)` levels -> `(rows, cols / 8)` int32 in AWQ's order."""
    packed = np.zeros((levels.shape[0], levels.shape[1] // 8), np.uint32)
    for c in range(packed.shape[1]):
        for i in range(8):
            packed[:, c] |= levels[:, 8 * c + ORDER[i]].astype(np.uint32) << np.uint32(4 * i)
    return packed.view(np.int32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("awq")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    state = {k: v.detach().half() for k, v in model.state_dict().items()}
    dequantised, exact = {}, {}
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                w = state.pop(f"{p}.weight").float()  # (out, in)
                blocks = w.reshape(w.shape[0], -1, GROUP)
                low, high = blocks.amin(-1), blocks.amax(-1)
                scales = ((high - low) / 15).clamp(min=1e-5).half().T.contiguous()  # (g, out)
                zeros = torch.round(-low / scales.T.float()).clamp(0, 15).T.to(torch.int32)
                g = torch.arange(w.shape[1]) // GROUP
                q = torch.clamp(torch.round(w.T / scales.float()[g]) + zeros[g], 0, 15)
                q = q.to(torch.int32)  # (in, out)
                state |= {f"{p}.qweight": torch.from_numpy(_pack(q.numpy())),
                          f"{p}.qzeros": torch.from_numpy(_pack(zeros.numpy())),
                          f"{p}.scales": scales}  # fmt: skip
                # dequantize_gemm: int levels minus zeros, times the float16 scales.
                dequantised[p] = ((q - zeros[g]).to(torch.int8) * scales[g]).T.contiguous()
                exact[p] = ((q - zeros[g]).float() * scales.float()[g]).T.contiguous()
    model.config.save_pretrained(root)
    safetensors_torch.save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    config_json = json.loads((root / "config.json").read_text())
    config_json["architectures"] = ["LlamaForCausalLM"]
    config_json["quantization_config"] = {"quant_method": "awq", "bits": 4, "version": "gemm",
                                          "group_size": GROUP, "zero_point": True}  # fmt: skip
    (root / "config.json").write_text(json.dumps(config_json))
    float_model = transformers.LlamaForCausalLM(config)
    plain = {k: v.float() for k, v in state.items() if k.endswith(".weight")}
    float_model.load_state_dict({**plain, **{f"{p}.weight": w for p, w in exact.items()}})
    return {"path": root, "dequantised": dequantised, "float": float_model.eval()}


def _layer(model: Any, i: int, part: str, proj: str) -> Any:
    layer = getattr(getattr(model.model.layers.layers, part), proj)
    return type(layer)(**{k: (v[i] if hasattr(v, "shape") else v) for k, v in vars(layer).items()})


def test_awq_layers_hold_the_packed_arrays_and_dequantise_as_the_format(
    checkpoint: dict[str, Any],
) -> None:
    model = from_pretrained(checkpoint["path"])  # float16
    stored = safetensors_torch.load_file(checkpoint["path"] / "model.safetensors")
    assert type(model.lm_head).__name__ == "Linear"
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                layer = _layer(model, i, part, proj)
                assert type(layer) is quant.AWQLinear
                for field in ("qweight", "qzeros", "scales"):
                    assert np.array_equal(np.asarray(getattr(layer, field)),
                                          stored[f"{p}.{field}"].numpy())  # fmt: skip
                got = np.asarray(layer.dequantised_weight())
                want = checkpoint["dequantised"][p].numpy()
                assert got.dtype == want.dtype == np.float16
                assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), p


def test_awq_logits_equal_the_float_model_over_the_dequantised_weights(
    checkpoint: dict[str, Any],
) -> None:
    model = from_pretrained(checkpoint["path"], dtype=jnp.float32)
    with torch.no_grad():
        want = checkpoint["float"](torch.tensor(IDS)).logits.numpy()
    got = np.asarray(model(input_ids=jnp.asarray(IDS)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_awq_options_treemod_does_not_read_are_refused_by_name(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    src = checkpoint["path"]
    for i, (change, word) in enumerate([
        ({"bits": 8}, "quantization_config.bits=8"),
        ({"version": "gemv"}, "quantization_config.version='gemv'"),
        ({"zero_point": False}, "quantization_config.zero_point=False"),
    ]):  # fmt: skip
        assert_refused(src, tmp_path / str(i), lambda q, c=change: q.update(c), word)


def test_awq_checkpoints_save_back_byte_for_byte(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    save_pretrained(from_pretrained(checkpoint["path"]), tmp_path)
    ours, theirs = quantization_configs(tmp_path, checkpoint["path"])
    assert ours == theirs


@pytest.mark.heavy
def test_transformers_loads_the_awq_checkpoint_treemod_saves(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    # transformers' AwqConfig(backend="torch_awq") is GPT-QModel's AwqTorchLinear, which
    # computes in float16 (a float32 input too), so the comparison is in float16.
    save_pretrained(from_pretrained(checkpoint["path"]), tmp_path / "saved")
    out = transformers_outputs({"awq": tmp_path / "saved"}, IDS, tmp_path / "transformers")
    assert_like_transformers(out, "awq", tmp_path / "saved", IDS, "AwqTorchLinear", "float16")
