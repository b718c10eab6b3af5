"""GPTQ checkpoints (4-bit, `checkpoint_format` "gptq" and "gptq_v2") into `GPTQLinear`, and
treemod's `Int4Linear` saved as GPTQ, against the format's definition: the checkpoints are
packed here as AutoGPTQ's `QuantLinear.pack` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py)
and GPTQModel's `pack` define it (read, not copied: qweight eight levels an int32 along the
input axis, level `8i + j` in bits `4j`; qzeros the zero points, minus one in "gptq" (v1) and
as they are in "gptq_v2", packed along the output axis; scales float16; g_idx the group of each
input), and dequantised as their torch kernel does, `scales[g_idx] * (q - zeros)` in the
scales' float16. What treemod saves is loaded by `transformers` with GPT-QModel's torch kernel
(in a fresh interpreter: `hub_checks.transformers_outputs`), whose dequantised weights and
float16 logits it is compared with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hub_checks import (
    assert_like_transformers,
    assert_refused,
    quantization_configs,
    transformers_outputs,
)

import treemod as tm
import treemod.quant as quant
from treemod.models import LlamaForCausalLM, from_pretrained, save_pretrained

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
    return q, scales, zeros


def _pack(q: np.ndarray, zeros: np.ndarray, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """qweight `(in / 8, out)` and qzeros `(groups, out / 8)`, int32, as GPTQ's `pack`; the
    zero points stored minus `offset` (1 in "gptq", 0 in "gptq_v2")."""
    qweight = np.zeros((q.shape[0] // 8, q.shape[1]), np.uint32)
    for j in range(8):
        qweight |= q[j::8].astype(np.uint32) << np.uint32(4 * j)
    assert (zeros >= offset).all()  # "gptq" cannot store a zero point of 0
    stored = (zeros - offset).astype(np.uint32)
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


CASES = {  # name: (sym, desc_act, checkpoint_format)
    "asym": (False, False, "gptq"),
    "sym-desc": (True, True, "gptq"),
    "asym-v2": (False, False, "gptq_v2"),
}


def _build(root: Path, sym: bool, desc_act: bool, form: str) -> dict[str, Any]:
    """A random Llama saved by transformers, its decoder projections GPTQ-packed; in "gptq_v2"
    each projection's first group is non-negative, so its zero points are 0."""
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
                if form == "gptq_v2":
                    w[:, g_idx == 0] = np.abs(w[:, g_idx == 0])
                q, scales, zeros = _quantise(w, g_idx.astype(np.int32), sym)
                assert form == "gptq" or (zeros[0] == 0).all()
                qweight, qzeros = _pack(q, zeros, 1 if form == "gptq" else 0)
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
        "sym": sym, "checkpoint_format": form, "damp_percent": 0.01,
        "true_sequential": True, "static_groups": False,
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config_json))
    float_model = transformers.LlamaForCausalLM(config)
    float_model.load_state_dict(
        {**{k: v.float() for k, v in state.items() if not k.endswith(("qweight", "qzeros",
            "scales", "g_idx"))}, **{f"{p}.weight": w for p, w in exact.items()}}
    )  # fmt: skip
    return {"path": root, "dequantised": dequantised, "float": float_model.eval()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {name: _build(tmp_path_factory.mktemp(name), *c) for name, c in CASES.items()}


@pytest.fixture(params=list(CASES))
def checkpoint(request: Any, checkpoints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": request.param, **checkpoints[request.param]}


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
                assert layer.zero_offset == (1 if checkpoint["name"] != "asym-v2" else 0)
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
        ({"checkpoint_format": "marlin"}, "quantization_config.checkpoint_format='marlin'"),
        ({"checkpoint_format": None, "format": "bitblas"}, "quantization_config.format='bitblas'"),
        ({"group_size": -1}, "group_size=-1"),
        ({"quant_method": "hqq"}, "quant_method='hqq'"),
    ]):  # fmt: skip
        assert_refused(src, tmp_path / str(i), lambda q, c=change: q.update(c), word)


def test_gptq_checkpoints_save_back_byte_for_byte(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    save_pretrained(from_pretrained(checkpoint["path"]), tmp_path)
    ours, theirs = quantization_configs(tmp_path, checkpoint["path"])
    assert ours == theirs


def test_gptq_layers_without_their_quantization_config_are_not_saved(
    checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    from treemod.models import PretrainedConfig

    model = from_pretrained(checkpoint["path"])
    bare = object.__new__(type(model))  # the same model, its config without the quantisation
    config = {k: v for k, v in model.config.to_dict().items() if k != "quantization_config"}
    bare.__dict__.update(vars(model), config=PretrainedConfig(config))
    with pytest.raises(ValueError, match=r"GPTQLinear layers \(e\.g\. 'model\.layers\.0\.") as e:
        save_pretrained(bare, tmp_path)
    assert "quant_method='gptq'" in str(e.value) and "dequantise" in str(e.value)


# treemod's own int4 (`Int4Linear`) saved as GPTQ: "gptq" quantises every projection (its zero
# points all at least 1), "gptq_v2" the attention ones only, `q_proj`'s weights made
# non-negative first so their zero points are 0 (and `transformers` must leave the MLP float).
LLAMA = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
QUANTISED = {"gptq": PROJ, "gptq_v2": {"self_attn": PROJ["self_attn"]}}


def _int4_model(form: str) -> Any:
    """A random treemod Llama (float32) quantised to int4 as `QUANTISED[form]` says."""
    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    if form == "gptq_v2":
        q = model.model.layers.layers.self_attn.q_proj
        model = tm.tree_at(lambda m: m.model.layers.layers.self_attn.q_proj.weight, model,
                           jnp.abs(q.weight))  # fmt: skip
    linears = [proj for names in QUANTISED[form].values() for proj in names]
    return quant.quantise(model, linears, "int4", group_size=GROUP)


def _int4_arrays(layer: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An `Int4Linear`'s levels `(out, in)` (its packing: column `2j` in the low nibble, `2j + 1`
    in the high one), zero points and float32 scales `(out, groups)`."""
    packed = np.asarray(layer.weight)
    levels = np.empty((packed.shape[0], 2 * packed.shape[1]), np.int64)
    levels[:, 0::2], levels[:, 1::2] = packed & 15, packed >> 4
    return levels, np.asarray(layer.zeros).astype(np.int64), np.asarray(layer.scales)


def _names(form: str) -> list[tuple[int, str, str]]:
    return [(i, part, proj) for i in range(2) for part, names in QUANTISED[form].items()
            for proj in names]  # fmt: skip


@pytest.fixture(scope="module")
def int4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The int4 models and the directories `save_pretrained` wrote for them."""
    out = {}
    for form in QUANTISED:
        model = _int4_model(form)
        path = tmp_path_factory.mktemp(f"int4-{form}")
        save_pretrained(model, path)
        out[form] = {"model": model, "path": path}
    return out


@pytest.fixture(scope="module")
def reference(
    checkpoints: dict[str, dict[str, Any]],
    int4: dict[str, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """`transformers`' float16 logits and first `q_proj` for the directories treemod saves: each
    GPTQ checkpoint loaded and saved again, and each int4 model saved."""
    dirs = {f"int4-{form}": entry["path"] for form, entry in int4.items()}
    for name, entry in checkpoints.items():
        dirs[name] = tmp_path_factory.mktemp(f"saved-{name}")
        save_pretrained(from_pretrained(entry["path"]), dirs[name])
    out = transformers_outputs(dirs, IDS, tmp_path_factory.mktemp("transformers"))
    return {"dirs": dirs, "out": out}


@pytest.mark.heavy
def test_transformers_loads_the_gptq_checkpoints_treemod_saves(
    checkpoint: dict[str, Any], reference: dict[str, Any]
) -> None:
    name = checkpoint["name"]
    out, directory = reference["out"], reference["dirs"][name]
    assert_like_transformers(out, name, directory, IDS, "TorchLinear", "float16")


@pytest.mark.heavy
@pytest.mark.parametrize("form", list(QUANTISED))
def test_transformers_loads_int4_models_saved_as_gptq(form: str, reference: dict[str, Any]) -> None:
    name = f"int4-{form}"
    out, directory = reference["out"], reference["dirs"][name]
    assert_like_transformers(out, name, directory, IDS, "TorchLinear", "float16")


@pytest.mark.parametrize("form", list(QUANTISED))
def test_int4_models_save_as_the_gptq_format(form: str, int4: dict[str, Any]) -> None:
    model, path = int4[form]["model"], int4[form]["path"]
    qconfig = json.loads((path / "config.json").read_text())["quantization_config"]
    inner = sorted({f"{part}.{proj}" for _, part, proj in _names(form)})
    assert qconfig == {
        "quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False,
        "sym": False, "checkpoint_format": form, "format": form,
        "block_name_to_quantize": "model.layers", "modules_in_block_to_quantize": [inner],
    }  # fmt: skip
    stored = safetensors_torch.load_file(path / "model.safetensors")
    for i, part, proj in [(i, part, proj) for i in range(2) for part, names in PROJ.items()
                          for proj in names]:  # fmt: skip
        p = f"model.layers.{i}.{part}.{proj}"
        if (i, part, proj) not in _names(form):
            assert stored[f"{p}.weight"].dtype == torch.float32 and f"{p}.qweight" not in stored
            continue
        layer = _layer(model, i, part, proj)
        assert type(layer) is quant.Int4Linear and f"{p}.weight" not in stored
        levels, zeros, scales = _int4_arrays(layer)
        qweight, qzeros = _pack(levels.T, zeros.T, 1 if form == "gptq" else 0)
        g_idx = (np.arange(levels.shape[1]) // GROUP).astype(np.int32)
        want = {"qweight": qweight, "qzeros": qzeros, "scales": scales.T.astype(np.float16),
                "g_idx": g_idx}  # fmt: skip
        for field, value in want.items():
            got = stored[f"{p}.{field}"].numpy()
            assert got.dtype == value.dtype and np.array_equal(got, value), (p, field)
    assert stored["lm_head.weight"].dtype == torch.float32
    zeros = np.asarray(model.model.layers.layers.self_attn.q_proj.zeros)
    assert (zeros == 0).any() == (form == "gptq_v2")


@pytest.mark.parametrize("form", list(QUANTISED))
def test_int4_models_reload_as_gptq_within_float16_scale_rounding(
    form: str, int4: dict[str, Any]
) -> None:
    model, path = int4[form]["model"], int4[form]["path"]
    loaded = from_pretrained(path)  # float32, the model's dtype
    assert type(loaded.model.layers.layers.mlp.up_proj).__name__ == (
        "GPTQLinear" if form == "gptq" else "Linear"
    )
    worst = 0.0
    for i, part, proj in _names(form):
        ours = _layer(model, i, part, proj)
        layer = _layer(loaded, i, part, proj)
        assert type(layer) is quant.GPTQLinear
        assert layer.zero_offset == (1 if form == "gptq" else 0)
        got = np.asarray(layer.dequantised_weight())
        # Exactly the int4 levels and zero points over the float16-rounded scales (the
        # products of a 5-bit and an 11-bit significand are exact in float32).
        levels, zeros, scales = _int4_arrays(ours)
        rounded = scales.astype(np.float16).astype(np.float32)
        want = (levels - np.repeat(zeros, GROUP, axis=1)) * np.repeat(rounded, GROUP, axis=1)
        np.testing.assert_array_equal(got, want)
        # float16 keeps 11 significant bits: each weight moves by at most 2^-11 of itself.
        w = np.asarray(ours.dequantised_weight())
        error = np.abs(got - w) / np.maximum(np.abs(w), np.finfo(np.float32).tiny)
        assert error.max() <= 2.0**-11
        worst = max(worst, float(error.max()))
    assert worst > 0  # the rounding is there, not skipped
    # Every weight within 2^-11 of itself moves the logits by less than 2^-11 of their largest
    # magnitude (measured: 1.7e-4 of 0.61).
    want = np.asarray(model(input_ids=jnp.asarray(IDS)))
    logits = np.asarray(loaded(input_ids=jnp.asarray(IDS)))
    np.testing.assert_allclose(logits, want, rtol=0, atol=2.0**-11 * np.abs(want).max())


def test_int4_models_gptq_cannot_hold_are_refused_by_name(tmp_path: Path) -> None:
    from treemod.quant._gptq import gptq_from_int4

    model = LlamaForCausalLM.from_config(LLAMA, key=jax.random.key(0))
    q = model.model.layers.layers.self_attn.q_proj
    huge = tm.tree_at(lambda m: m.model.layers.layers.self_attn.q_proj.weight, model,
                      q.weight * 1e8)  # fmt: skip
    twice = quant.quantise(quant.quantise(model, ["q_proj"], "int4", group_size=GROUP),
                           ["k_proj"], "int4", group_size=2 * GROUP)  # fmt: skip
    mixed = quant.quantise(quant.quantise(model, ["q_proj"], "int4", group_size=GROUP),
                           ["k_proj"], "nf4")  # fmt: skip
    odd = LlamaForCausalLM.from_config({**LLAMA, "intermediate_size": 100},
                                       key=jax.random.key(0))  # fmt: skip
    for i, (bad, words) in enumerate([
        (quant.quantise(model, ["q_proj", "lm_head"], "int4", group_size=GROUP),
         ["int4 layer 'lm_head' is outside", "model.layers", "lm_head float"]),
        (twice, ["group sizes [32, 64]", "'model.layers.0.self_attn.q_proj'", "one group_size"]),
        (quant.quantise(huge, ["q_proj"], "int4", group_size=GROUP),
         ["'model.layers.0.self_attn.q_proj' has scales beyond float16's range"]),
        (quant.quantise(odd, ["down_proj"], "int4", group_size=4),
         ["'model.layers.0.mlp.down_proj' is 64x100", "multiples of 8"]),
        (mixed, ["Int4Linear and NF4Linear", "one scheme", "dequantise"]),
    ]):  # fmt: skip
        with pytest.raises(ValueError) as info:
            save_pretrained(bad, tmp_path / str(i))
        for word in words:
            assert word in str(info.value), (word, str(info.value))
    # A name in some blocks only cannot come from a zoo model (a Stack's layers share one
    # structure), so the check is called as save_pretrained calls it.
    layer = _layer(quant.quantise(model, ["q_proj"], "int4", group_size=GROUP), 0,
                   "self_attn", "q_proj")  # fmt: skip
    with pytest.raises(ValueError) as info:
        gptq_from_int4({"model.layers.0.self_attn.q_proj": layer},
                       ["model.layers.1.self_attn.q_proj"])  # fmt: skip
    for word in ["'model.layers.1.self_attn.q_proj' is float", "include 'self_attn.q_proj'",
                 "modules_in_block_to_quantize", "same layers in every block"]:  # fmt: skip
        assert word in str(info.value)
