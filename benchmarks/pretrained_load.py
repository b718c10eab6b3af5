"""Loading a Hugging Face checkpoint: `treemod.models.from_pretrained` against the alternatives.

A GPT-2 medium-sized checkpoint (355M float32 parameters, 1.42 GB; random values, GPT-2's
tensor names, `config.json` as `transformers` writes it) is written to a temporary directory
and loaded by three contenders, each in a fresh process (imports done before the clock starts):

- `treemod`: `from_pretrained(directory)`, arrays ready on the default device;
- `safetensors+device_put`: `safetensors.numpy.load_file` then `jax.device_put` of every
  tensor (no model, no checks: the floor for reading the file into JAX);
- `transformers`: `GPT2LMHeadModel.from_pretrained(directory)` (PyTorch, CPU).

Each round runs every contender once, in an order that rotates between rounds, after one
discarded warm-up round (the file in the page cache for all). Reported: median wall time and
range, the ratio of medians to `safetensors+device_put` (goal for treemod: <= 1.1x), and peak
resident memory while loading (VmHWM after resetting it, minus the resident size before) as a
multiple of the checkpoint's size (goal <= 1.3x). The directory is deleted at the end.

    python -m benchmarks.pretrained_load [--quick] [--rounds N]

`--quick` writes a tiny checkpoint and runs one round (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CONTENDERS = ("treemod", "safetensors+device_put", "transformers")
MEDIUM = {"n_embd": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 50257, "n_positions": 1024}
TINY = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 32}


def write_checkpoint(directory: Path, sizes: dict[str, int]) -> int:
    """A GPT-2 checkpoint with random values in `directory`; its tensor bytes."""
    import numpy as np
    from safetensors.numpy import save_file

    e, v, p = sizes["n_embd"], sizes["vocab_size"], sizes["n_positions"]
    shapes = {"transformer.wte.weight": (v, e), "transformer.wpe.weight": (p, e)}
    for i in range(sizes["n_layer"]):
        block = f"transformer.h.{i}"
        for norm in ("ln_1", "ln_2"):
            shapes[f"{block}.{norm}.weight"] = (e,)
            shapes[f"{block}.{norm}.bias"] = (e,)
        for name, (fan_in, fan_out) in {
            "attn.c_attn": (e, 3 * e),
            "attn.c_proj": (e, e),
            "mlp.c_fc": (e, 4 * e),
            "mlp.c_proj": (4 * e, e),
        }.items():
            shapes[f"{block}.{name}.weight"] = (fan_in, fan_out)
            shapes[f"{block}.{name}.bias"] = (fan_out,)
    shapes["transformer.ln_f.weight"] = (e,)
    shapes["transformer.ln_f.bias"] = (e,)
    rng = np.random.default_rng(0)
    tensors = {n: rng.standard_normal(s, np.float32) * 0.02 for n, s in shapes.items()}
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), {"format": "pt"})
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "dtype": "float32",
        **sizes,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return sum(t.nbytes for t in tensors.values())


# What each fresh process runs: imports, then the timed load, then the figures as JSON.
_CHILD = r"""
import json, sys, time
contender, directory = sys.argv[1], sys.argv[2]

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

import jax
if contender == "treemod":
    from treemod.models import from_pretrained
    load = lambda: jax.block_until_ready(from_pretrained(directory))
elif contender == "safetensors+device_put":
    from safetensors.numpy import load_file
    def load():
        tensors = load_file(directory + "/model.safetensors")
        return jax.block_until_ready({k: jax.device_put(v) for k, v in tensors.items()})
else:
    import torch, transformers
    load = lambda: transformers.GPT2LMHeadModel.from_pretrained(directory)
jax.block_until_ready(jax.device_put(1.0))  # start the backend outside the clock
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
start = time.perf_counter()
loaded = load()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_bytes": status("VmHWM") - base}))
"""


def measure(contender: str, directory: Path) -> dict[str, float]:
    """One load by `contender` in a fresh process: seconds and peak bytes above the baseline."""
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, contender, str(directory)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{contender} failed:\n{result.stdout}\n{result.stderr}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def run(rounds: int, sizes: dict[str, int], contenders: tuple[str, ...]) -> dict[str, Any]:
    """Write the checkpoint, measure every contender `rounds` times (rotating), summarise."""
    directory = Path(tempfile.mkdtemp(prefix="tm-pretrained-bench-"))
    try:
        size = write_checkpoint(directory, sizes)
        for contender in contenders:  # warm-up round, discarded
            measure(contender, directory)
        samples: dict[str, list[dict[str, float]]] = {c: [] for c in contenders}
        for r in range(rounds):
            order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
            for contender in order:
                samples[contender].append(measure(contender, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    summary: dict[str, Any] = {"checkpoint_bytes": size, "rounds": rounds, "contenders": {}}
    floor = statistics.median(s["seconds"] for s in samples["safetensors+device_put"])
    for contender, runs in samples.items():
        seconds = [s["seconds"] for s in runs]
        peaks = [s["peak_bytes"] / size for s in runs]
        summary["contenders"][contender] = {
            "median_s": statistics.median(seconds),
            "range_s": [min(seconds), max(seconds)],
            "ratio_to_safetensors": statistics.median(seconds) / floor,
            "peak_rss_x_checkpoint": statistics.median(peaks),
            "peak_range": [min(peaks), max(peaks)],
        }
    return summary


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"checkpoint: {summary['checkpoint_bytes'] / 1e9:.2f} GB, {summary['rounds']} rounds "
        f"(medians, [ranges])",
        f"{'contender':<24} {'load s':>18} {'x safetensors':>14} {'peak RSS x size':>22}",
    ]
    for name, c in summary["contenders"].items():
        lo, hi = c["range_s"]
        plo, phi = c["peak_range"]
        lines.append(
            f"{name:<24} {c['median_s']:7.2f} [{lo:.2f}-{hi:.2f}] "
            f"{c['ratio_to_safetensors']:14.2f} {c['peak_rss_x_checkpoint']:9.2f} "
            f"[{plo:.2f}-{phi:.2f}]"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny checkpoint, one round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset")
    args = parser.parse_args(argv)
    contenders = tuple(c for c in args.contenders.split(",") if c)
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or "safetensors+device_put" not in contenders:
        parser.error(
            f"--contenders: a subset of {', '.join(CONTENDERS)} that includes "
            f"safetensors+device_put (the reference); got {args.contenders!r}"
        )
    sizes = TINY if args.quick else MEDIUM
    summary = run(1 if args.quick else args.rounds, sizes, contenders)
    print(report(summary))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
