"""Load a Hugging Face checkpoint directory into treemod, run it, and compare with PyTorch.

Given a directory in Hugging Face's layout (`config.json` with `model.safetensors`, or shards
with `model.safetensors.index.json`, e.g. from `huggingface_hub.snapshot_download("gpt2")`),
the script

1. loads it with `treemod.models.from_pretrained` (the class from the config's
   `architectures`), timing the load;
2. runs the model under `filter_jit` on a few token ids and, for a causal LM, continues them
   greedily with `treemod.models.generate` (one compiled program with a key-value cache);
3. when `transformers` and PyTorch are installed, loads the same directory with `transformers`
   and reports the largest difference of the logits (relative to their largest value);
4. saves the model back with `treemod.models.save_pretrained` and checks that it reloads equal.

Without a directory it first writes a small GPT-2 checkpoint of its own (random weights, built
by treemod itself, so nothing is downloaded).

    python examples/pretrained.py                 # a small GPT-2 written locally
    python examples/pretrained.py path/to/gpt2    # a downloaded checkpoint
    python examples/pretrained.py --quick         # a tiny model, checks the pipeline
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import treemod as tm
from treemod.models import CausalLM, GPT2LMHeadModel, from_pretrained, generate, save_pretrained

# GPT-2's shapes, smaller; its end-of-text token is the last of the vocabulary, as in GPT-2.
SMALL = {"n_embd": 256, "n_layer": 4, "n_head": 8, "vocab_size": 5000, "n_positions": 256}
TINY = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 200, "n_positions": 64}
for _config in (SMALL, TINY):
    _config["bos_token_id"] = _config["eos_token_id"] = _config["vocab_size"] - 1


def write_checkpoint(directory: Path, config: dict[str, int]) -> None:
    """A GPT-2 with random weights, built and saved by treemod."""
    model = GPT2LMHeadModel.from_config(config, key=jax.random.key(0))
    save_pretrained(model, directory)


def run(model: Any, ids: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The logits of `ids`, and for a causal LM `ids` continued greedily by `steps` tokens."""
    logits = np.asarray(tm.filter_jit(lambda m, x: m(input_ids=x))(model, ids))
    if not isinstance(model, CausalLM):
        return logits, None
    return logits, np.asarray(generate(model, ids, max_new_tokens=steps))


def compare_with_transformers(directory: Path, ids: np.ndarray, ours: np.ndarray) -> float | None:
    """Largest |ours - transformers| over the largest |transformers|, or None if not installed."""
    if (
        importlib.util.find_spec("torch") is None
        or importlib.util.find_spec("transformers") is None
    ):
        return None
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.no_grad():
        theirs = model.eval()(input_ids=torch.from_numpy(ids)).logits.numpy()
    return float(np.abs(ours.astype(np.float64) - theirs).max() / np.abs(theirs).max())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "directory",
        nargs="?",
        default=None,
        help="a Hugging Face checkpoint directory; none: write a small GPT-2 first",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny model and a short generation")
    parser.add_argument(
        "--dtype", default=None, help="cast the weights to this dtype while loading (bfloat16, ...)"
    )
    parser.add_argument("--steps", type=int, default=8, help="how many tokens to generate")
    parser.add_argument(
        "--max-shard-size",
        default="5GB",
        help="the largest weight file when saving back ('500MB', or bytes)",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="treemod-pretrained-") as scratch:
        if args.directory is None:
            directory = Path(scratch) / "gpt2"
            write_checkpoint(directory, TINY if args.quick else SMALL)
            print(f"wrote a random GPT-2 checkpoint to {directory}")
        else:
            directory = Path(args.directory)

        start = time.perf_counter()
        model = from_pretrained(
            directory, dtype=None if args.dtype is None else jnp.dtype(args.dtype)
        )
        jax.block_until_ready(model)
        seconds = time.perf_counter() - start
        print(
            f"loaded {type(model).__name__} ({model.num_parameters():,} parameters, "
            f"{model.dtype}) in {seconds:.2f} s"
        )

        ids = np.array([[11, 42, 7, 99, 3]])
        steps = 3 if args.quick else args.steps
        logits, extended = run(model, ids, steps)
        new = "none (not a causal LM)" if extended is None else extended[0, ids.shape[1] :].tolist()
        print(f"logits: {logits.shape}; greedy continuation: {new}")

        error = compare_with_transformers(directory, ids, logits.astype(np.float32))
        if error is None:
            print("transformers/PyTorch not installed: no comparison")
        else:
            print(f"largest difference from transformers (relative): {error:.2e}")

        resaved = Path(scratch) / "resaved"
        size = int(args.max_shard_size) if args.max_shard_size.isdigit() else args.max_shard_size
        save_pretrained(model, resaved, max_shard_size=size)
        again = from_pretrained(resaved)
        same = tm.tree_equal(tm.filter(again, tm.is_array), tm.filter(model, tm.is_array))
        print(f"saved back to {resaved.name}/ and reloaded equal: {bool(same)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
