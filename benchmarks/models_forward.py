"""Forward pass of each `treemod.models` family against `transformers` on the CPU.

For each family a `transformers` model is random-initialised from a realistic small config, the
treemod model is built from the same `config.json` and loaded from its `state_dict()` (so both
compute the same numbers; the largest relative difference is reported), then one forward pass
is timed: treemod's model under `tm.filter_jit` against PyTorch eager under
`torch.inference_mode()` (and `torch.compile`, with `--compile`). Contenders alternate within
each round (the order reversed every other round) after warm-up calls; we report the median and
range of each and the ratio of medians torch / treemod (above 1: treemod is faster). Goal:
faster than `transformers`.

Families and sizes (batch 1): GPT-2 small (124M, 128 tokens), Llama ~120M (hidden 768, 12
layers, 4 KV heads, 128 tokens), BERT-base (128 tokens), ViT-base/16 at 224, ResNet-50 at 224
(`transformers`' and torchvision's). `--quick` runs tiny configs (torchvision's resnet18 at
32x32): a smoke run, not a measurement.

    python -m benchmarks.models_forward [--quick] [--families bert,vit] [--rounds N] [--compile]
        [--threads N]

The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

# name: (transformers class, treemod module, treemod class, full config, quick config, input)
FAMILIES: dict[str, tuple[str, str, str, dict[str, Any], dict[str, Any], str]] = {
    "gpt2": (
        "GPT2LMHeadModel",
        "treemod.models.gpt2",
        "GPT2LMHeadModel",
        {},
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "vocab_size": 100,
            "n_positions": 64,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
        "tokens",
    ),
    "llama": (
        "LlamaForCausalLM",
        "treemod.models.llama",
        "LlamaForCausalLM",
        {
            "hidden_size": 768,
            "intermediate_size": 2048,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
        },
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
        },
        "tokens",
    ),
    "bert": (
        "BertModel",
        "treemod.models.bert",
        "BertModel",
        {},
        {
            "vocab_size": 100,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
        },
        "tokens+mask",
    ),
    "vit": (
        "ViTModel",
        "treemod.models.vit",
        "ViTModel",
        {},
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "image_size": 32,
            "patch_size": 8,
        },
        "pixels",
    ),
    "resnet": (
        "ResNetModel",
        "treemod.models.resnet",
        "ResNetModel",
        {},
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]},
        "pixels",
    ),
    "torchvision-resnet50": ("", "treemod.models.resnet_torchvision", "resnet50", {}, {}, "image"),
}
SEQ, QUICK_SEQ, IMAGE, QUICK_IMAGE = 128, 16, 224, 32


def _inputs(kind: str, quick: bool, config: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    if kind.startswith("tokens"):
        seq = QUICK_SEQ if quick else SEQ
        inputs = {"input_ids": rng.integers(0, config.get("vocab_size", 100), (1, seq))}
        if kind == "tokens+mask":
            inputs["attention_mask"] = np.ones((1, seq), np.int64)
        return inputs
    size = QUICK_IMAGE if quick else IMAGE
    pixels = rng.standard_normal((1, 3, size, size)).astype(np.float32)
    return {"pixel_values": pixels} if kind == "pixels" else {"x": pixels}


def _pair(family: str, quick: bool) -> tuple[Any, Any, dict[str, Any]]:
    """The `transformers` (or torchvision) model, the loaded treemod twin, and the inputs."""
    import importlib

    import jax
    import torch
    import transformers

    import treemod as tm

    hf_name, module, cls_name, full, small, kind = FAMILIES[family]
    torch.manual_seed(0)
    if not hf_name:  # torchvision
        import torchvision

        # --quick: resnet18 (the same code path, a quarter of the compile).
        name = "resnet18" if quick else cls_name
        reference = getattr(torchvision.models, name)(weights=None).eval()
        builder = getattr(importlib.import_module(module), name)
        model = tm.load_state_dict(builder(key=jax.random.key(0)), reference.state_dict())
        return reference, model, _inputs(kind, quick, {})
    ours = getattr(importlib.import_module(module), cls_name)
    hf_cls = getattr(transformers, hf_name)
    reference = hf_cls(hf_cls.config_class(**(small if quick else full))).eval()
    config = json.loads(reference.config.to_json_string())
    model = ours.from_config(config, key=jax.random.key(0))
    tensors = dict(reference.state_dict())
    for alias in model.tied_weights():
        tensors.pop(alias)
    model = tm.load_state_dict(model, tensors)
    return reference, model, _inputs(kind, quick, config)


def _contenders(
    reference: Any, model: Any, inputs: dict[str, Any], compile_torch: bool
) -> tuple[dict[str, Callable[[], Any]], float, list[str]]:
    import numpy as np
    import torch

    import treemod as tm

    torch_inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    positional = "x" in inputs

    @tm.filter_jit
    def forward(m: Any, batch: dict[str, Any]) -> Any:
        return m(batch["x"]) if positional else m(**batch)

    def run_treemod() -> Any:
        return forward(model, inputs).block_until_ready()

    def run_module(module: Any) -> Callable[[], Any]:
        def run() -> Any:
            with torch.inference_mode():
                out = module(torch_inputs["x"]) if positional else module(**torch_inputs)
            if positional:
                return out
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

        return run

    runs: dict[str, Callable[[], Any]] = {"treemod": run_treemod, "torch": run_module(reference)}
    notes = []
    if compile_torch:
        try:
            compiled = run_module(torch.compile(reference))
            compiled()
            runs["torch.compile"] = compiled
        except Exception as error:  # noqa: BLE001 (an optional contender: report and go on)
            notes.append(f"torch.compile skipped: {type(error).__name__}: {str(error)[:120]}")
    ours = np.asarray(run_treemod())
    theirs = runs["torch"]().numpy()
    error = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    return runs, error, notes


def _measure(
    runs: dict[str, Callable[[], Any]], rounds: int, warmup: int
) -> dict[str, list[float]]:
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _limit_threads(n: int) -> None:
    import os
    import sys

    import torch

    torch.set_num_threads(n)
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen={'true' if n > 1 else 'false'} "
            f"intra_op_parallelism_threads={n}"
        ).strip()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one line per family and a JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny configs, 3 rounds (smoke)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="add torch.compile")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for both (torch.set_num_threads; XLA's Eigen pool, if jax is not "
        "imported yet); 1 is steadier on a loaded machine",
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        _limit_threads(args.threads)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    rounds = args.rounds or (3 if args.quick else 10)
    summary: dict[str, Any] = {
        "rounds": rounds,
        "quick": args.quick,
        "threads": args.threads,
        "families": {},
    }
    for family in families:
        reference, model, inputs = _pair(family, args.quick)
        runs, error, notes = _contenders(reference, model, inputs, args.compile)
        times = _measure(runs, rounds, warmup=1 if args.quick else 3)
        stats = {
            name: {
                "median_s": statistics.median(ts),
                "min_s": min(ts),
                "max_s": max(ts),
            }
            for name, ts in times.items()
        }
        ours = stats["treemod"]["median_s"]
        for s in stats.values():
            s["ratio_to_treemod"] = s["median_s"] / ours
        summary["families"][family] = {"contenders": stats, "max_rel_error": error, "notes": notes}
        cells = "  ".join(
            f"{name} {1e3 * s['median_s']:.1f} ms [{1e3 * s['min_s']:.1f}-{1e3 * s['max_s']:.1f}]"
            for name, s in stats.items()
        )
        ratio = stats["torch"]["ratio_to_treemod"]
        print(f"{family:22s} {cells}  torch/treemod {ratio:.2f}x  (rel. error {error:.1e})")
        for note in notes:
            print(f"    {note}")
        del reference, model, runs
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
