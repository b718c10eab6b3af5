"""Checks the quantised-checkpoint tests share: a checkpoint directory with its
`quantization_config` changed, the byte-for-byte comparison of two saved directories, and what
`transformers` computes for saved directories (in a fresh interpreter)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch as safetensors_torch
import torch


def with_config(src: Path, dst: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    """`dst`: `src`'s weights (linked) with `change` applied to its `quantization_config`."""
    dst.mkdir(parents=True)
    (dst / "model.safetensors").symlink_to(src / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    change(config["quantization_config"])
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def quantization_configs(ours: Path, theirs: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both directories' `quantization_config`, after checking that their tensors have the same
    names, dtypes, shapes and bytes."""
    want = safetensors_torch.load_file(theirs / "model.safetensors")
    got = safetensors_torch.load_file(ours / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name].view(torch.uint8), value.view(torch.uint8)), name
    return tuple(  # type: ignore[return-value]
        json.loads((d / "config.json").read_text())["quantization_config"] for d in (ours, theirs)
    )


Change = Callable[[dict[str, Any]], None]


def assert_refused(src: Path, dst: Path, change: Change, word: str) -> None:
    """`from_pretrained` of `src` with `change` made to its `quantization_config` raises a
    `CheckpointError` naming `word` and the config file."""
    import pytest

    from treemod import CheckpointError
    from treemod.models import from_pretrained

    directory = with_config(src, dst, change)
    with pytest.raises(CheckpointError) as info:
        from_pretrained(directory)
    assert word in str(info.value) and str(directory / "config.json") in str(info.value)


def transformers_outputs(
    checkpoints: dict[str, Path], ids: Any, work: Path, dtype: str = "float16"
) -> dict[str, Any]:
    """What `transformers` (GPTQ and AWQ through GPT-QModel) computes for each checkpoint
    directory: `{name}.logits` and `{name}.q_proj` (the first decoder layer's dequantised
    weight, float32 `(out, in)`), from one fresh interpreter running `hub_transformers.py`.

    GPT-QModel patches `safetensors`' and `transformers`' globals when imported, so it never
    runs in the test process: the Makefile installs it and optimum (`REFERENCE_LOADERS`) into
    `<venv>/reference-loaders`, which only this subprocess puts on its path. Without them (or
    accelerate) a GPTQ or AWQ checkpoint's test is skipped, or fails under CI (set `CI`)."""
    import os
    import subprocess
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    import numpy as np
    import pytest

    methods = {
        json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"]
        for path in checkpoints.values()
    }
    # transformers' GPTQ loader goes through optimum to GPT-QModel, its AWQ one straight there.
    needs = {"gptq": ("gptqmodel", "optimum"), "awq": ("gptqmodel", "accelerate")}
    loaders = str(Path(sys.prefix) / "reference-loaders")
    missing = sorted({
        m for k in methods for m in needs.get(k, ())
        if not (PathFinder.find_spec(m, [loaders]) or find_spec(m))
    })  # fmt: skip
    if missing:
        message = f"{', '.join(missing)} not installed (make installs them in {loaders})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI runs the transformers reference, so install them.")
        pytest.skip(message)
    entries = {name: {"path": str(path), "dtype": dtype} for name, path in checkpoints.items()}
    spec = {"ids": np.asarray(ids).tolist(), "checkpoints": entries}
    work.mkdir(parents=True, exist_ok=True)
    (work / "spec.json").write_text(json.dumps(spec))
    # No torch.compile (its C++ build takes longer than the run); GPT-QModel's temporary
    # folders go under `work`; no network.
    path = os.pathsep.join(p for p in (loaders, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1", "TMPDIR": str(work), "PYTHONPATH": path,
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    script = Path(__file__).with_name("hub_transformers.py")
    done = subprocess.run(
        [sys.executable, str(script), str(work / "spec.json"), str(work / "out.npz")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(work / "out.npz") as out:
        return {k: out[k] for k in out.files}


def first_q_proj(model: Any) -> Any:
    """The first decoder layer's `self_attn.q_proj` of a treemod Llama (its `Stack` sliced)."""
    layer = model.model.layers.layers.self_attn.q_proj
    return type(layer)(**{k: (v[0] if hasattr(v, "shape") else v) for k, v in vars(layer).items()})


def assert_like_transformers(
    out: dict[str, Any], name: str, directory: Path, ids: Any, kernel: str, dtype: str
) -> None:
    """treemod's model from `directory`, in `dtype`, against `transformers_outputs`' `name`:
    `transformers` used the `kernel` class, the first `q_proj`'s dequantised weights are equal
    bit for bit, and so are the logits up to the order of summation: within 8 ulps of their
    largest magnitude in float16 (each side rounds every matmul, norm and activation to
    float16 in its own order), within 1e-5 relative in float32."""
    import jax.numpy as jnp
    import numpy as np

    from treemod.models import from_pretrained

    assert str(out[f"{name}.class"]) == kernel
    model = from_pretrained(directory, dtype=getattr(jnp, dtype))
    got = np.asarray(first_q_proj(model).dequantised_weight().astype(jnp.float32))
    assert np.array_equal(got, out[f"{name}.q_proj"]), name
    want = out[f"{name}.logits"]
    logits = np.asarray(model(input_ids=jnp.asarray(ids)).astype(jnp.float32))
    if dtype == "float16":
        ulp = float(np.spacing(np.float16(np.abs(want).max())))
        np.testing.assert_allclose(logits, want, rtol=0, atol=8 * ulp, err_msg=name)
    else:
        np.testing.assert_allclose(logits, want, rtol=1e-5, atol=1e-6, err_msg=name)
