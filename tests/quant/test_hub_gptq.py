"""GPTQ checkpoints (4-bit, `checkpoint_format: "gptq"`) into `GPTQLinear`, against the format's
definition: the checkpoints are packed here as AutoGPTQ's `QuantLinear.pack`
(auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py) and GPTQModel's `pack` define it (read, not
copied: qweight eight levels an int32 along the input axis, level `8i + j` in bits `4j`; qzeros
the zero points minus one, packed along the output axis; scales float16; g_idx the group of each
input), and dequantised as their torch kernel does, `scales[g_idx] * (q - (zeros + 1))` in the
scales' float16. (GPTQModel installs only from source with CUDA extensions, and transformers'
GPTQ loader needs it, so the reference is the format's definition, computed with torch.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from hub_checks import assert_refused, quantization_configs

import treemod.quant as quant
from treemod.models import from_pretrained

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

PROJ = {"self_attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "mlp": ["gate_proj", "up_proj", "down_proj"]}  # fmt: skip
GROUP = 32
IDS = np.array([[1, 5, 7, 9, 11, 3]])


def _quantise(w: np.ndarray, g_idx: np.ndarray, sym: bool) -> tuple[Any, Any, Any]:
    """GPTQ's 4-bit quantiser per group (no Hessian): levels `(in, out)`, scales float16 and
    zero points `(groups, out)`."""
    out_f, in_f = w.shape
    groups = in_f // GROUP
    scales = np.empty((groups, out_f), np.float16)
    zeros = np.empty((groups, out_f), np.int64)
    for g in range(groups):
        x = w[:, g_idx == g]
        low, high = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
        if sym:
            high = np.maximum(-low, high)
            low = -high
        scales[g] = ((high - low) / 15).astype(np.float16)
        zeros[g] = 8 if sym else np.round(-low / scales[g].astype(np.float32))
    s, z = scales[g_idx].astype(np.float32), zeros[g_idx]  # (in, out)
    q = np.clip(np.round(w.T / s) + z, 0, 15).astype(np.int64)
    assert (zeros >= 1).all()  # the "gptq" format stores zero - 1
    return q, scales, zeros


def _pack(q: np.ndarray, zeros: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qweight `(in / 8, out)` and qzeros `(groups, out / 8)`, int32, as GPTQ's `pack`."""
    qweight = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for j in range(8):
        qweight |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
    stored = (zeros - 1).astype(np.uint32)
    qzeros = np.zeros((zeros.shape[0], zeros.shape[1] // 8), np.uint32)
    for j in range(8):
        qzeros |= stored[:, j::8] << np.uint32(4 * j)
    return qweight.view(np.int32), qzeros.view(np.int32)


def _reference(q: Any, scales: Any, zeros: Any, g_idx: Any, dtype: Any) -> Any:
    """The torch kernel's dequantisation, `(out, in)`, computed in `dtype` (the kernel's is
    float16, the scales' dtype)."""
    q_t, z_t = torch.from_numpy(q).to(torch.int16), torch.from_numpy(zeros).to(torch.int16)
    g = torch.from_numpy(g_idx).long()
    return (torch.from_numpy(scales).to(dtype)[g] * (q_t - z_t[g])).T.contiguous()


@pytest.fixture(scope="module", params=[(False, False), (True, True)], ids=["asym", "sym-desc"])
def checkpoint(request: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A random Llama saved by transformers, its decoder projections GPTQ-packed."""
    sym, desc_act = request.param
    root = tmp_path_factory.mktemp("gptq")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    state = {k: v.detach().half() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    dequantised, exact = {}, {}
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                w = state.pop(f"{p}.weight").float().numpy()
                n_in = w.shape[1]
                g_idx = np.arange(n_in) // GROUP
                if desc_act:  # act-order: the groups are taken in a permuted order of inputs
                    g_idx = g_idx[rng.permutation(n_in)]
                q, scales, zeros = _quantise(w, g_idx.astype(np.int32), sym)
                qweight, qzeros = _pack(q, zeros)
                state |= {f"{p}.qweight": torch.from_numpy(qweight),
                          f"{p}.qzeros": torch.from_numpy(qzeros),
                          f"{p}.scales": torch.from_numpy(scales),
                          f"{p}.g_idx": torch.from_numpy(g_idx.astype(np.int32))}  # fmt: skip
                dequantised[p] = _reference(q, scales, zeros, g_idx, torch.float16)
                exact[p] = _reference(q, scales, zeros, g_idx, torch.float32)
    model.config.save_pretrained(root)
    safetensors_torch.save_file(state, root / "model.safetensors", metadata={"format": "pt"})
    config_json = json.loads((root / "config.json").read_text())
    config_json["architectures"] = ["LlamaForCausalLM"]
    config_json["quantization_config"] = {
        "quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": desc_act,
        "sym": sym, "checkpoint_format": "gptq", "damp_percent": 0.01,
        "true_sequential": True, "static_groups": False,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config_json))
    float_model = transformers.LlamaForCausalLM(config)
    float_model.load_state_dict(
        {**{k: v.float() for k, v in state.items() if not k.endswith(("qweight", "qzeros",
            "scales", "g_idx"))}, **{f"{p}.weight": w for p, w in exact.items()}}
    )  # fmt: skip
    return {"path": root, "dequantised": dequantised, "float": float_model.eval()}


def _layer(model: Any, i: int, part: str, proj: str) -> Any:
    layer = getattr(getattr(model.model.layers.layers, part), proj)
    return type(layer)(**{k: (v[i] if hasattr(v, "shape") else v) for k, v in vars(layer).items()})


def test_gptq_layers_hold_the_packed_arrays_and_dequantise_as_the_format(
    checkpoint: dict[str, Any],
) -> None:
    model = from_pretrained(checkpoint["path"])  # float16, the checkpoint's dtype
    stored = safetensors_torch.load_file(checkpoint["path"] / "model.safetensors")
    assert type(model.lm_head).__name__ == "Linear"
    for i in range(2):
        for part, names in PROJ.items():
            for proj in names:
                p = f"model.layers.{i}.{part}.{proj}"
                layer = _layer(model, i, part, proj)
                assert type(layer) is quant.GPTQLinear
                for field in ("qweight", "qzeros", "scales", "g_idx"):
                    assert np.array_equal(np.asarray(getattr(layer, field)),
                                          stored[f"{p}.{field}"].numpy())  # fmt: skip
                got = np.asarray(layer.dequantised_weight())
                want = checkpoint["dequantised"][p].numpy()
                assert got.dtype == np.float16
                assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), p


def test_gptq_logits_equal_the_float_model_over_the_dequantised_weights(
    checkpoint: dict[str, Any],
) -> None:
    model = from_pretrained(checkpoint["path"], dtype=jnp.float32)
    with torch.no_grad():
        want = checkpoint["float"](torch.tensor(IDS)).logits.numpy()
    got = np.asarray(model(input_ids=jnp.asarray(IDS)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gptq_options_treemod_does_not_read_are_refused_by_name(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    src = checkpoint["path"]
    for i, (change, word) in enumerate([
        ({"bits": 8}, "quantization_config.bits=8"),
        ({"checkpoint_format": "gptq_v2"}, "checkpoint_format='gptq_v2'"),
        ({"group_size": -1}, "group_size=-1"),
        ({"quant_method": "hqq"}, "quant_method='hqq'"),
    ]):  # fmt: skip
        assert_refused(src, tmp_path / str(i), lambda q, c=change: q.update(c), word)


def test_gptq_checkpoints_save_back_byte_for_byte(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    from treemod.models import save_pretrained

    save_pretrained(from_pretrained(checkpoint["path"]), tmp_path)
    ours, theirs = quantization_configs(tmp_path, checkpoint["path"])
    assert ours == theirs


def test_gptq_layers_without_their_quantization_config_are_not_saved(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    from treemod.models import PretrainedConfig, save_pretrained

    model = from_pretrained(checkpoint["path"])
    bare = object.__new__(type(model))  # the same model, its config without the quantisation
    config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    bare.__dict__.update(vars(model), config=PretrainedConfig(config))
    with pytest.raises(ValueError, match=r"GPTQLinear layers \(e\.g\. 'model\.layers\.0\.") as e:
        save_pretrained(bare, tmp_path)
    assert "quant_method='gptq'" in str(e.value) and "dequantise" in str(e.value)
