"""Train a small causal character-level Transformer on Python's own standard library.

The text is the source of the running interpreter's standard-library modules (`*.py` files next
to `os.py`, read in sorted order up to a size limit), so it is real, available offline on every
machine, and needs no download. The model is a decoder-only Transformer: token and position
embeddings, a `treemod.nn.Stack` of pre-norm blocks (causal `MultiheadAttention` with a boolean
mask, an MLP, dropout) applied with one `lax.scan`, a final LayerNorm and a linear head. It
prints the validation loss as it trains and samples generated from a prompt.

    python examples/char_transformer.py            # ~400 KB of text, a few minutes of training
    python examples/char_transformer.py --quick    # a tiny model for a few steps (tests)
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

import treemod as tm
import treemod.nn as nn

VOCAB = 256  # bytes: every file decodes, and no vocabulary has to be stored with the model


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


class Block(tm.Module):
    """A pre-norm Transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    norm1: nn.LayerNorm
    attention: nn.MultiheadAttention
    norm2: nn.LayerNorm
    fc1: nn.Linear
    fc2: nn.Linear
    dropout: nn.Dropout

    def __init__(self, width: int, num_heads: int, dropout: float, *, key: PRNGKeyArray) -> None:
        key1, key2, key3 = jax.random.split(key, 3)
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(num_heads, width, key=key1)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width, key=key2)
        self.fc2 = nn.Linear(4 * width, width, key=key3)
        self.dropout = nn.Dropout(dropout)

    def __call__(
        self,
        x: Float[Array, "*batch seq width"],
        mask: Bool[Array, "seq seq"],
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "*batch seq width"]:
        key1, key2 = (None, None) if key is None else jax.random.split(key)
        h = self.norm1(x)
        x = x + self.dropout(self.attention(h, h, h, mask=mask), key=key1)
        h = self.fc2(jax.nn.gelu(self.fc1(self.norm2(x))))
        return x + self.dropout(h, key=key2)


class Transformer(tm.Module):
    """A decoder-only Transformer over bytes with learned position embeddings."""

    token_embedding: nn.Embedding
    position_embedding: nn.Embedding
    blocks: nn.Stack
    norm: nn.LayerNorm
    head: nn.Linear
    context: int = tm.field(static=True)

    def __init__(
        self,
        *,
        context: int,
        width: int,
        depth: int,
        num_heads: int,
        dropout: float,
        key: PRNGKeyArray,
    ) -> None:
        key1, key2, key3, key4 = jax.random.split(key, 4)
        self.token_embedding = nn.Embedding(VOCAB, width, key=key1)
        self.position_embedding = nn.Embedding(context, width, key=key2)
        self.blocks = nn.Stack(lambda k: Block(width, num_heads, dropout, key=k), depth, key=key3)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, key=key4)
        self.context = context

    def __call__(
        self, tokens: Int[Array, "*batch seq"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch seq 256"]:
        seq = tokens.shape[-1]
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))  # query i sees keys 0..i
        positions = jnp.broadcast_to(jnp.arange(seq), tokens.shape)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        x = self.blocks(x, causal, key=key)
        return self.head(self.norm(x))


def loss_fn(
    model: Transformer, tokens: Int[Array, "batch seq1"], key: PRNGKeyArray | None
) -> Float[Array, ""]:
    logits = model(tokens[:, :-1], key=key)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def make_step(optimiser: optax.GradientTransformation) -> Any:
    @tm.filter_jit
    def step(model: Transformer, opt_state: Any, tokens: Array, key: PRNGKeyArray) -> Any:
        loss, grads = tm.filter_value_and_grad(loss_fn)(model, tokens, key)
        updates, opt_state = optimiser.update(grads, opt_state, tm.filter(model, tm.is_param))
        return tm.apply_updates(model, updates), opt_state, loss

    return step


@tm.filter_jit
def evaluate(model: Transformer, tokens: Int[Array, "n batch seq1"]) -> Float[Array, ""]:
    model = nn.inference_mode(model)
    return jax.lax.map(lambda t: loss_fn(model, t, None), tokens).mean()


@tm.filter_jit
def next_byte(
    model: Transformer, window: Int[Array, " context"], key: PRNGKeyArray, temperature: float
) -> Int[Array, ""]:
    logits = nn.inference_mode(model)(window)[-1]
    return jax.random.categorical(key, logits / temperature)


def generate(
    model: Transformer, prompt: bytes, length: int, *, key: PRNGKeyArray, temperature: float = 0.7
) -> str:
    """Sample `length` bytes after `prompt`, one at a time, from a sliding window of context."""
    window = np.frombuffer(prompt[-model.context :].rjust(model.context, b" "), np.uint8)
    window = window.astype(np.int32)
    out = bytearray()
    for k in jax.random.split(key, length):
        byte = int(next_byte(model, jnp.asarray(window), k, temperature))
        out.append(byte)
        window = np.append(window[1:], np.int32(byte))
    return out.decode("utf-8", errors="replace")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny model for 6 steps on 20 KB, to test the pipeline (overrides the sizes)",
    )
    parser.add_argument(
        "--bytes", type=int, default=400_000, help="bytes of standard-library source to read"
    )
    parser.add_argument("--steps", type=int, default=1000, help="number of training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per training step")
    parser.add_argument(
        "--context", type=int, default=64, help="bytes of context the model sees (sequence length)"
    )
    parser.add_argument("--width", type=int, default=96, help="embedding width of the model")
    parser.add_argument("--depth", type=int, default=3, help="number of Transformer blocks")
    parser.add_argument(
        "--heads", type=int, default=4, help="attention heads per block (must divide --width)"
    )
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0, help="model, data and sampling seed")
    args = parser.parse_args(argv)
    if args.quick:
        args.bytes, args.steps, args.context, args.width, args.depth = 20_000, 6, 16, 32, 2
        args.batch_size = 8
    eval_every = max(1, args.steps // 5)

    text = load_text(args.bytes)
    data = np.frombuffer(text, np.uint8).astype(np.int32)
    split = int(0.9 * len(data))
    train, valid = data[:split], data[split:]
    print(
        f"text: {len(text) / 1e3:.0f} KB of standard-library source ({len(train)} training bytes)"
    )

    # Validation: fixed, non-overlapping windows; a few batches of them.
    n_valid = min(len(valid) // (args.context + 1), 8 * args.batch_size)
    n_valid -= n_valid % args.batch_size
    valid_windows = valid[: n_valid * (args.context + 1)].reshape(
        -1, args.batch_size, args.context + 1
    )

    key = jax.random.key(args.seed)
    model_key, train_key, sample_key = jax.random.split(key, 3)
    model = Transformer(
        context=args.context,
        width=args.width,
        depth=args.depth,
        num_heads=args.heads,
        dropout=0.1,
        key=model_key,
    )
    print(tm.tree_summary(model))
    warmup = min(100, args.steps // 4)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, args.steps)
    optimiser = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01)
    )
    opt_state = optimiser.init(tm.filter(model, tm.is_param))
    step = make_step(optimiser)

    rng = np.random.default_rng(args.seed)
    offsets = np.arange(args.context + 1)
    valid_tokens = jnp.asarray(valid_windows)
    initial_loss = float(evaluate(model, valid_tokens))
    print(f"step {0:5d}  validation loss {initial_loss:.3f} (uniform: {math.log(VOCAB):.3f})")
    start = time.perf_counter()
    valid_loss = initial_loss
    for i, k in enumerate(jax.random.split(train_key, args.steps), start=1):
        starts = rng.integers(0, len(train) - args.context - 1, args.batch_size)
        tokens = jnp.asarray(train[starts[:, None] + offsets])
        model, opt_state, loss = step(model, opt_state, tokens, k)
        if i % eval_every == 0 or i == args.steps:
            valid_loss = float(evaluate(model, valid_tokens))
            elapsed = time.perf_counter() - start
            print(
                f"step {i:5d}  training loss {float(loss):.3f}  validation loss {valid_loss:.3f}"
                f"  ({elapsed:.1f} s)"
            )

    prompt = bytes(valid[: args.context].astype(np.uint8))
    sample = generate(model, prompt, 40 if args.quick else 300, key=sample_key)
    print("prompt:\n" + prompt.decode("utf-8", errors="replace"))
    print("sample:\n" + sample)
    return {"initial_loss": initial_loss, "valid_loss": valid_loss, "sample_length": len(sample)}


if __name__ == "__main__":
    main()
