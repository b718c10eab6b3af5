"""Speculative decoding on the CPU: `generate(..., assistant_model=draft)` against plain greedy.

A Llama-shaped target (random weights from a fixed seed; by default 8 layers of width 512)
decodes 64 greedy tokens from an 8-token prompt, three ways in alternating rounds after
warm-up calls: plainly; with a draft that agrees (the target's first 2 layers, embedding and
head, the target's later layers adding little to the residual stream: a stand-in for a
distilled draft, at a quarter of the target's layers); and with a small random draft (2 layers
of width 128) that rarely agrees (the cost of a useless draft). The tokens of all three must
be identical. Reported: median seconds per generation with the range, tokens per second, the
ratio to plain greedy, and each draft's acceptance (accepted proposals over proposals).

    python -m benchmarks.speculative [--quick] [--rounds N] [--k N]

`--quick` uses a tiny model and 8 new tokens for one round (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from . import timing

TARGET = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
DRAFT = {**TARGET, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
TINY = {**TARGET, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
PROMPT = 8


def _target_and_its_draft(sizes: dict[str, int], layers: int) -> tuple[Any, Any]:
    """A target whose layers after the first `layers` write 1% of their output, and the draft
    made of its first `layers` layers, embedding, norm and head."""
    import jax

    import treemod as tm
    from treemod.models import LlamaForCausalLM

    target = LlamaForCausalLM.from_config(sizes, key=jax.random.key(0))
    stacked = target.model.layers.layers
    quiet = [stacked.self_attn.o_proj.weight, stacked.mlp.down_proj.weight]
    target = tm.tree_at(
        lambda m: [
            m.model.layers.layers.self_attn.o_proj.weight,
            m.model.layers.layers.mlp.down_proj.weight,
        ],
        target,
        [w.at[layers:].multiply(0.01) for w in quiet],
    )
    draft = LlamaForCausalLM.from_config(
        {**sizes, "num_hidden_layers": layers}, key=jax.random.key(2)
    )
    first = jax.tree.map(
        lambda a: a[:layers] if isinstance(a, jax.Array) else a, target.model.layers.layers
    )
    draft = tm.tree_at(
        lambda m: (m.model.layers.layers, m.model.embed_tokens, m.model.norm, m.lm_head),
        draft,
        (first, target.model.embed_tokens, target.model.norm, target.lm_head),
    )
    return target, draft


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a line per contender and a JSON summary last."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 8 tokens (smoke)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--k", type=int, default=5, help="draft tokens per round")
    args = parser.parse_args(argv)
    import jax
    import numpy as np

    from treemod.models import LlamaForCausalLM, generate
    from treemod.models._generation_config import GenerationSettings
    from treemod.models._speculative import speculative_decode

    target_sizes, draft_sizes, new = (
        (TINY, {**TINY, "num_hidden_layers": 1}, 8) if args.quick else (TARGET, DRAFT, 64)
    )
    rounds = args.rounds or (1 if args.quick else 5)
    target, agreeing = _target_and_its_draft(
        target_sizes, max(1, target_sizes["num_hidden_layers"] // 4)
    )
    small = LlamaForCausalLM.from_config(draft_sizes, key=jax.random.key(1))
    ids = np.random.default_rng(0).integers(0, target_sizes["vocab_size"], (1, PROMPT))
    drafts = {"agreeing draft": agreeing, "random draft": small}
    runs: dict[str, Any] = {"plain greedy": lambda: generate(target, ids, max_new_tokens=new)}
    for name, draft in drafts.items():
        runs[name] = lambda d=draft: generate(
            target, ids, max_new_tokens=new, assistant_model=d, num_assistant_tokens=args.k
        )
    outputs = {name: np.asarray(run()) for name, run in runs.items()}  # warm-up: compiles
    identical = all(np.array_equal(o, outputs["plain greedy"]) for o in outputs.values())
    s = GenerationSettings(new, 0, False, 1.0, None, None, None, 1.0, 1, (), 0, (), ())
    acceptance = {}
    for name, draft in drafts.items():
        _, _, stats = speculative_decode(target, draft, jax.numpy.asarray(ids), s, args.k)
        acceptance[name] = int(stats.accepted) / (int(stats.rounds) * args.k)
    times = timing.alternate(runs, rounds, ready=lambda out: out)
    base = statistics.median(times["plain greedy"])
    results = {
        name: {
            **timing.summary(ts, unit="s"),
            "tokens_per_s": new / statistics.median(ts),
            "speedup_over_plain": base / statistics.median(ts),
            **({"acceptance": acceptance[name]} if name in acceptance else {}),
        }
        for name, ts in times.items()
    }
    for name, r in results.items():
        extra = f"  acceptance {r['acceptance']:.0%}" if "acceptance" in r else ""
        print(
            f"{name:15s} {r['median_s']:.3f} s [{r['min_s']:.3f}-{r['max_s']:.3f}]  "
            f"{r['tokens_per_s']:.1f} tokens/s  {r['speedup_over_plain']:.2f}x{extra}"
        )
    print(f"identical tokens: {identical}")
    summary = {"quick": args.quick, "rounds": rounds, "new_tokens": new, "k": args.k,
               "identical_tokens": identical, "contenders": results}  # fmt: skip
    print(json.dumps(summary))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
