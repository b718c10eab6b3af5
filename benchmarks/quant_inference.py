"""Quantised inference: logits error of treemod's int8 and NF4 next to bitsandbytes' on the same
weights, and generation speed of int8, NF4 and bf16 models on the CPU.

One small Llama (4 layers, width 512, MLP 1408, 8 heads, 4 key-value heads, vocabulary 4096;
random init from a fixed seed) is built in `transformers` and saved; every contender loads
those weights. Logits of 2 x 64 random tokens are compared with the float32 model's (max abs
and RMS of the difference): treemod's int8 and NF4 (block 64, double quantisation) of every
decoder projection, and bitsandbytes' own int8 (LLM.int8, threshold 6) and NF4 (the same
options) through `transformers`' `BitsAndBytesConfig` on bitsandbytes' CPU backend. Target
(issue 49): treemod's error at most bitsandbytes'.

Speed: `treemod.models.generate` (greedy, batch 1, prompt 8, 32 new tokens) of the bf16 model and
of its int8 and NF4 quantisations (computing in bf16), alternating per round
(`benchmarks/timing.py`), medians and ranges in tokens per second. Then, to show where the time
goes, one projection of TinyLlama's MLP shape (2048 -> 5632) for one token: the bf16 matmul, the
int8 and NF4 layers (also dequantising all rows at once instead of in 16 slices), and their
dequantisation alone: XLA's CPU code dequantises into a
temporary and then runs the dot (it does not fuse the two), so a quantised matmul costs the
dequantisation plus the dot.

    python -m benchmarks.quant_inference [--rounds N]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from . import timing

CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
NEW, PROMPT = 32, 8


def _errors(logits: Any, reference: Any) -> dict[str, float]:
    import numpy as np

    diff = np.asarray(logits, np.float64) - np.asarray(reference, np.float64)
    return {"max_abs": float(np.abs(diff).max()), "rms": float(np.sqrt(np.mean(diff**2)))}


def accuracy(directory: Path, ids: Any) -> dict[str, dict[str, float]]:
    """Logits error against the float32 model, of treemod's and bitsandbytes' int8 and NF4."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    import treemod.quant as quant
    from treemod.models import from_pretrained

    def torch_logits(quantisation: Any) -> Any:
        model = transformers.LlamaForCausalLM.from_pretrained(
            directory, quantization_config=quantisation, dtype=torch.float32, device_map="cpu"
        )
        with torch.no_grad():
            return model(torch.tensor(ids)).logits.float().numpy()

    reference = torch_logits(None)
    float32 = from_pretrained(directory)
    rows = {"treemod float32": _errors(float32(input_ids=jnp.asarray(ids)), reference)}
    for scheme in ("int8", "nf4"):
        model = quant.quantise(float32, TARGETS, scheme)
        rows[f"treemod {scheme}"] = _errors(model(input_ids=jnp.asarray(ids)), reference)
    bnb = transformers.BitsAndBytesConfig
    rows["bitsandbytes int8"] = _errors(torch_logits(bnb(load_in_8bit=True)), reference)
    nf4 = bnb(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    rows["bitsandbytes nf4"] = _errors(torch_logits(nf4), reference)
    rows["(the logits)"] = _errors(reference, np.zeros_like(reference))  # their own size
    return rows


def speed(directory: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds per generation of the bf16, int8 and NF4 models, alternating per round."""
    import jax.numpy as jnp
    import numpy as np

    import treemod.quant as quant
    from treemod.models import from_pretrained, generate

    bf16 = from_pretrained(directory, dtype=jnp.bfloat16)
    models = {
        "bf16": bf16,
        "int8": quant.quantise(bf16, TARGETS, "int8"),
        "nf4": quant.quantise(bf16, TARGETS, "nf4"),
    }
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, 4096, (1, PROMPT)))
    cases = {
        name: (lambda m=m: generate(m, prompt, max_new_tokens=NEW, eos_token_id=None))
        for name, m in models.items()
    }
    return timing.alternate(cases, rounds, warmup=1)


def one_projection(rounds: int) -> dict[str, list[float]]:
    """Seconds per call for one token through a 2048 -> 5632 projection, and its parts."""
    import jax
    import jax.numpy as jnp

    import treemod as tm
    import treemod.nn as nn
    import treemod.quant as quant

    linear = nn.Linear(2048, 5632, use_bias=False, dtype=jnp.bfloat16, key=jax.random.key(0))
    mlp = nn.Sequential([linear])
    int8 = quant.quantise(mlp, ["0"], "int8").layers[0]
    nf4 = quant.quantise(mlp, ["0"], "nf4").layers[0]
    x = jnp.ones((1, 2048), jnp.bfloat16)
    call = tm.filter_jit(lambda layer, x: layer(x))
    dequantise = tm.filter_jit(lambda layer: layer.dequantised_weight())
    whole = {}
    for name, layer in (("int8", int8), ("nf4", nf4)):
        # The same layer dequantising all its rows at once (`slices` is a static field).
        one = object.__new__(type(layer))
        one.__dict__.update(vars(layer), slices=1)
        whole[name] = one
    cases = {
        "bf16 matmul": lambda: call(linear, x),
        "int8 layer": lambda: call(int8, x),
        "int8 layer, 1 slice": lambda: call(whole["int8"], x),
        "nf4 layer": lambda: call(nf4, x),
        "nf4 layer, 1 slice": lambda: call(whole["nf4"], x),
        "int8 dequantise only": lambda: dequantise(int8),
        "nf4 dequantise only": lambda: dequantise(nf4),
    }
    return timing.alternate(cases, rounds, block=20, warmup=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(tmp)
        ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (2, 64))
        errors = accuracy(directory, ids)
        print("logits error against the float32 model (2 x 64 tokens)")
        print(f"{'':<22}{'max abs':>12}{'RMS':>12}")
        for name, row in errors.items():
            print(f"{name:<22}{row['max_abs']:12.3e}{row['rms']:12.3e}")
        for scheme in ("int8", "nf4"):
            ours, theirs = errors[f"treemod {scheme}"], errors[f"bitsandbytes {scheme}"]
            verdict = "met" if ours["rms"] <= theirs["rms"] * 1.01 else "missed"
            print(f"{scheme}: treemod RMS / bitsandbytes RMS = {ours['rms'] / theirs['rms']:.3f} "
                  f"(target <= 1: {verdict})")  # fmt: skip
        samples = speed(directory, args.rounds)
    print(f"\ngeneration, batch 1, prompt {PROMPT}, {NEW} new tokens ({args.rounds} rounds)")
    for name, s in samples.items():
        tokens = [NEW / t for t in s]
        print(f"{name:<6} {timing.spread(tokens)} tokens/s  "
              f"(time / bf16: {timing.paired_ratio(s, samples['bf16']):.2f})")  # fmt: skip
    parts = one_projection(args.rounds)
    print("\none token through a 2048 -> 5632 projection (bf16 compute), microseconds per call")
    for name, s in parts.items():
        print(f"{name:<22} {timing.spread(s, scale=1e6)}")


if __name__ == "__main__":
    main()
