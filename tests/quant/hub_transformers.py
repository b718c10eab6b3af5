"""Loads quantised checkpoint directories with `transformers` (GPTQ and AWQ through GPT-QModel)
and saves each one's logits and its first decoder layer's dequantised `q_proj` weight.

Run as a script in a fresh interpreter, never imported by the tests: importing GPT-QModel
patches `safetensors`' and `transformers`' globals for the rest of the process.

    python hub_transformers.py SPEC.json OUT.npz

`SPEC.json`: `{"ids": [[...]], "checkpoints": {name: {"path": ..., "dtype": "float32"}}}`;
`OUT.npz` holds `{name}.logits` and `{name}.q_proj` (float32 `(out, in)`). The kernels are the
ones needing no compiled extension (`gptq_torch`, `torch_awq`); `torch.compile` is off (the
caller sets `TORCH_COMPILE_DISABLE=1`), so nothing is compiled.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch
import transformers


def _load(path: str, dtype: str) -> Any:
    method = json.loads(open(f"{path}/config.json").read())["quantization_config"]
    method = method["quant_method"]
    options: dict[str, Any] = {}
    if method == "gptq":
        options["quantization_config"] = transformers.GPTQConfig(bits=4, backend="gptq_torch")
    elif method == "awq":
        options["quantization_config"] = transformers.AwqConfig(bits=4, backend="torch_awq")
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, device_map="cpu", dtype=getattr(torch, dtype), **options
    )


def _weight(layer: Any) -> np.ndarray:
    """The layer's dequantised `(out, in)` weight as the loaded kernel computes it."""
    if hasattr(layer, "dequantize_weight"):  # GPT-QModel's GPTQ kernels: `(in, out)`
        return layer.dequantize_weight().T.float().numpy()
    if hasattr(layer, "_dequantize_weight_for_inference"):  # its AWQ kernel, in float16
        x = torch.empty((0, layer.in_features), dtype=torch.float16)
        return layer._dequantize_weight_for_inference(x, dtype=torch.float16).T.float().numpy()
    return layer.weight.float().numpy()


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    ids = torch.tensor(spec["ids"])
    out: dict[str, np.ndarray] = {}
    for name, entry in spec["checkpoints"].items():
        model = _load(entry["path"], entry.get("dtype", "float32")).eval()
        with torch.no_grad():
            out[f"{name}.logits"] = model(ids).logits.float().numpy()
            out[f"{name}.q_proj"] = _weight(model.model.layers[0].self_attn.q_proj)
            out[f"{name}.class"] = np.array(type(model.model.layers[0].self_attn.q_proj).__name__)
    np.savez(sys.argv[2], **out)


if __name__ == "__main__":
    main()
