"""Decoding speed: `treemod.models.generate` against `transformers`' `generate` on the CPU.

One GPT-2-small-sized checkpoint (124M float32 parameters, random init from a fixed seed) is
built in `transformers` and moved into treemod with `tm.load_state_dict`. Both contenders
decode greedily from the same prompt (batch 1, 8 tokens) for 64 new tokens (no
end-of-sequence id, so every run makes all 64), in one process, in an order that alternates
between rounds, after warm-up calls (treemod's first call compiles; its time is reported
apart). The tokens of both must be identical. Reported: median seconds per generation with the
range, decoding tokens per second (64 / median), the ratio of medians (goal: treemod faster),
and the number of compilations over the whole 64-token generation, counted with
`filter_jit`'s trace counter and the traces of the cached forward pass (goal: one per shape,
prefill and step).

    python -m benchmarks.generation [--quick] [--rounds N] [--threads N]

`--quick` uses a tiny model and 8 new tokens for one round (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from . import timing

SMALL = {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
TINY = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 128, "n_positions": 64}
PROMPT = 8


def _pair(sizes: dict[str, int]) -> tuple[Any, Any]:
    """`(hf_model, treemod_model)` with equal weights, GPT-2 with no end-of-sequence id."""
    import jax
    import numpy as np
    import torch
    import transformers

    import treemod as tm
    from treemod.models import GPT2LMHeadModel

    config = {**sizes, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config.from_dict(config)).eval()
    model = tm.filter_eval_shape(lambda: GPT2LMHeadModel.from_config(config, key=jax.random.key(0)))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for alias, source in model.tied_weights().items():
        np.testing.assert_array_equal(state.pop(alias), state[source])
    return hf, tm.load_state_dict(model, state)


def _count_traces(model: Any, ids: Any, new: int) -> tuple[dict[str, Any], Any]:
    """Generate once with fresh trace counters: the counts, the first call's time, the tokens."""
    import treemod.models._generate as generation

    forward_shapes: list[list[int]] = []
    original_forward, original_run = generation.cached_logits, generation._run

    def counting(*args: Any) -> Any:
        forward_shapes.append(list(args[1].shape))
        return original_forward(*args)

    run = original_run.with_max_traces(None)
    generation.cached_logits, generation._run = counting, run  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        tokens = generation.generate(model, ids, max_new_tokens=new)
        tokens.block_until_ready()
        first = time.perf_counter() - start
        generation.generate(model, ids, max_new_tokens=new).block_until_ready()
    finally:
        generation.cached_logits, generation._run = original_forward, original_run
    counts = {
        "program_traces": run.num_traces,
        "forward_traces": forward_shapes,
        "first_call_s": first,
    }
    return counts, tokens


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a line per contender and a JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 tokens (smoke)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    import numpy as np
    import torch

    from treemod.models import generate

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    sizes, new = (TINY, 8) if args.quick else (SMALL, 64)
    rounds = args.rounds or (1 if args.quick else 5)
    hf, model = _pair(sizes)
    ids = np.random.default_rng(0).integers(0, sizes["vocab_size"], (1, PROMPT))
    traces, ours = _count_traces(model, ids, new)
    ids_t = torch.from_numpy(ids)

    def run_hf() -> Any:
        with torch.no_grad():
            return hf.generate(ids_t, max_new_tokens=new, do_sample=False, pad_token_id=0)

    runs = {
        "treemod": lambda: generate(model, ids, max_new_tokens=new).block_until_ready(),
        "transformers": run_hf,
    }
    theirs = run_hf().numpy()
    identical = bool(np.array_equal(np.asarray(ours), theirs))
    times = timing.alternate(runs, rounds, ready=lambda out: out)
    stats = {
        name: {**timing.summary(ts, unit="s"), "tokens_per_s": new / statistics.median(ts)}
        for name, ts in times.items()
    }
    summary = {
        "quick": args.quick,
        "rounds": rounds,
        "new_tokens": new,
        "prompt": PROMPT,
        "torch_threads": torch.get_num_threads(),
        "contenders": stats,
        "speedup_treemod_over_transformers": stats["transformers"]["median_s"]
        / stats["treemod"]["median_s"],
        "identical_tokens": identical,
        "compilations": traces,
    }
    for name, s in stats.items():
        print(
            f"{name:13s} {s['median_s']:.3f} s [{s['min_s']:.3f}-{s['max_s']:.3f}]  "
            f"{s['tokens_per_s']:.1f} tokens/s"
        )
    print(
        f"treemod/transformers speed {summary['speedup_treemod_over_transformers']:.2f}x; "
        f"identical tokens: {identical}; generate program traced {traces['program_traces']}x, "
        f"forward traced for {traces['forward_traces']}; first call "
        f"{traces['first_call_s']:.1f} s"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
