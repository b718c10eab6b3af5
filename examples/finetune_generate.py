"""Fine-tune a small Llama with LoRA in bfloat16 on Python's own source, then generate.

The pieces of `treemod` for fine-tuning and generation, together:

- a Llama-family model from a config (or `--checkpoint DIR`, a Hugging Face directory read by
  `treemod.models.from_pretrained`; its token ids are used as bytes, so it needs a vocabulary of
  at least 256);
- LoRA adapters on the attention and MLP projections (`treemod.lora.add_lora`, PEFT's module
  names), only the adapters trained (`treemod.lora.trainable` splits them from the frozen
  weights for `filter_value_and_grad` and optax);
- mixed precision (`treemod.precision.apply_policy(model, jnp.bfloat16)`): float32 master
  weights, bfloat16 arithmetic, norms, softmax and the loss in float32;
- byte-level text from the standard library's `*.py` files (as `char_transformer.py` reads it),
  with a tqdm progress bar;
- the adapter saved in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`, which
  `peft.PeftModel.from_pretrained` reads) and loaded back into the base model;
- text sampled with `treemod.models.generate` (compiled key-value-cache decoding) before and
  after training.

    python examples/finetune_generate.py                  # a few minutes on a laptop CPU
    python examples/finetune_generate.py --quick          # a tiny model for a few steps (tests)
    python examples/finetune_generate.py --checkpoint DIR # adapters for a saved model
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

import treemod as tm
import treemod.lora as lora
import treemod.precision as precision
from treemod.models import LlamaForCausalLM, from_pretrained, generate

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_text(max_bytes: int) -> bytes:
    """The standard library's `*.py` files, in sorted order, concatenated up to `max_bytes`."""
    stdlib = pathlib.Path(os.path.dirname(os.__file__))
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data[: max_bytes - total])
        total += len(chunks[-1])
        if total >= max_bytes:
            break
    return b"".join(chunks)


def build_model(args: argparse.Namespace, key: jax.Array) -> Any:
    """The base model: from `--checkpoint`, or a small byte-level Llama from a config."""
    if args.checkpoint is not None:
        model = from_pretrained(args.checkpoint)
        vocab = model.config.get("vocab_size", 0)
        if vocab < 256:
            raise SystemExit(
                f"--checkpoint {args.checkpoint}: vocab_size {vocab} < 256; this example feeds "
                "bytes as token ids and needs at least 256 of them."
            )
        return model
    width = 32 if args.quick else 128
    config = {
        "vocab_size": 256,
        "hidden_size": width,
        "intermediate_size": 2 * width,
        "num_hidden_layers": 2 if args.quick else 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    }
    return LlamaForCausalLM.from_config(config, key=key)


def loss_fn(adapters: Any, frozen: Any, tokens: jax.Array) -> jax.Array:
    model = tm.combine(adapters, frozen)
    logits = model(input_ids=tokens[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def make_step(optimiser: optax.GradientTransformation) -> Any:
    @tm.filter_jit
    def step(adapters: Any, frozen: Any, opt_state: Any, tokens: jax.Array) -> Any:
        loss, grads = tm.filter_value_and_grad(loss_fn)(adapters, frozen, tokens)
        updates, opt_state = optimiser.update(grads, opt_state, adapters)
        return tm.apply_updates(adapters, updates), opt_state, loss

    return step


@tm.filter_jit
def evaluate(model: Any, windows: jax.Array) -> jax.Array:
    adapters, frozen = tm.partition(model, lora.trainable(model))
    return jax.lax.map(lambda t: loss_fn(adapters, frozen, t), windows).mean()


def sample(model: Any, prompt: bytes, length: int, key: jax.Array) -> str:
    """`length` bytes after `prompt`, sampled (temperature 0.8, top-k 40, top-p 0.95)."""
    ids = np.frombuffer(prompt, np.uint8).astype(np.int32)[None]
    out = generate(
        model,
        ids,
        max_new_tokens=length,
        do_sample=True,
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        key=key,
    )
    return bytes(np.asarray(out[0, ids.shape[1] :], np.uint8)).decode("utf-8", errors="replace")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny model for 8 steps on 20 KB, to test the pipeline (overrides the sizes)",
    )
    parser.add_argument(
        "--checkpoint", default=None, help="a Hugging Face Llama-family directory to adapt"
    )
    parser.add_argument(
        "--adapter-dir", default=None, help="where to save the adapter (a temporary directory)"
    )
    parser.add_argument(
        "--bytes", type=int, default=300_000, help="bytes of standard-library source to read"
    )
    parser.add_argument("--steps", type=int, default=300, help="number of training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per training step")
    parser.add_argument("--context", type=int, default=128, help="bytes per training window")
    parser.add_argument("--rank", type=int, default=16, help="the LoRA rank r of each adapter")
    parser.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (scale alpha/r)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of AdamW")
    parser.add_argument("--sample-length", type=int, default=200, help="bytes to generate")
    parser.add_argument("--seed", type=int, default=0, help="model, data and sampling seed")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if args.quick:
        args.bytes, args.steps, args.batch_size, args.context = 20_000, 8, 8, 32
        args.rank, args.alpha, args.sample_length = 4, 8.0, 24

    text = load_text(args.bytes)
    data = np.frombuffer(text, np.uint8).astype(np.int32)
    split = int(0.9 * len(data))
    train, valid = data[:split], data[split:]
    print(f"text: {len(text) / 1e3:.0f} KB of standard-library source")
    n_valid = min(len(valid) // (args.context + 1), 4 * args.batch_size)
    n_valid -= n_valid % args.batch_size
    valid_windows = jnp.asarray(
        valid[: n_valid * (args.context + 1)].reshape(-1, args.batch_size, args.context + 1)
    )

    model_key, lora_key, sample_key = jax.random.split(jax.random.key(args.seed), 3)
    base = build_model(args, model_key)
    model = lora.add_lora(base, TARGETS, r=args.rank, alpha=args.alpha, key=lora_key)
    model = precision.apply_policy(model, jnp.bfloat16)
    adapters, frozen = tm.partition(model, lora.trainable(model))
    n_adapter = sum(x.size for x in jax.tree_util.tree_leaves(adapters))
    n_total = sum(x.size for x in jax.tree_util.tree_leaves(tm.filter(model, tm.is_array)))
    print(
        f"model: {type(base).__name__}, {n_total / 1e6:.2f}M parameters, of which "
        f"{n_adapter / 1e3:.1f}K in LoRA adapters (r={args.rank}); computing in bfloat16"
    )

    prompt = bytes(valid[:32].astype(np.uint8))
    before = sample(model, prompt, args.sample_length, sample_key)
    initial = float(evaluate(model, valid_windows))
    print(f"validation loss before: {initial:.3f} (uniform over bytes: {math.log(256):.3f})")

    schedule = optax.warmup_cosine_decay_schedule(
        0.0, args.lr, max(1, args.steps // 10), args.steps
    )
    optimiser = optax.adamw(schedule, weight_decay=0.0)
    opt_state = optimiser.init(adapters)
    step = make_step(optimiser)
    rng = np.random.default_rng(args.seed)
    offsets = np.arange(args.context + 1)
    start = time.perf_counter()
    bar = tqdm(range(args.steps), desc="LoRA", unit="step", disable=args.no_progress)
    for _ in bar:
        starts = rng.integers(0, len(train) - args.context - 1, args.batch_size)
        tokens = jnp.asarray(train[starts[:, None] + offsets])
        adapters, opt_state, loss = step(adapters, frozen, opt_state, tokens)
        bar.set_postfix(loss=f"{float(loss):.3f}")
    model = tm.combine(adapters, frozen)
    final = float(evaluate(model, valid_windows))
    elapsed = time.perf_counter() - start
    print(f"validation loss after {args.steps} steps: {final:.3f} ({elapsed:.1f} s)")

    with tempfile.TemporaryDirectory() as scratch:
        directory = pathlib.Path(args.adapter_dir or scratch)
        lora.save_adapter(model, directory)
        files = sorted(p.name for p in directory.iterdir())
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(f"saved the adapter in PEFT's format: {', '.join(files)} ({size / 1e3:.0f} KB)")
        reloaded = precision.apply_policy(lora.load_adapter(base, directory), jnp.bfloat16)
    same = tm.tree_equal(
        tm.filter(reloaded, lora.trainable(reloaded)), tm.filter(model, lora.trainable(model))
    )
    reloaded_loss = float(evaluate(reloaded, valid_windows))
    print(f"reloaded adapter equal: {bool(same)}, validation loss {reloaded_loss:.3f}")

    after = sample(reloaded, prompt, args.sample_length, sample_key)
    print("prompt:\n" + prompt.decode("utf-8", errors="replace"))
    print("sample before:\n" + before)
    print("sample after:\n" + after)
    return {"initial_loss": initial, "final_loss": final, "reloaded_loss": reloaded_loss}


if __name__ == "__main__":
    main()
