"""Train a small CNN with BatchNorm and Dropout on scikit-learn's bundled 8x8 digits.

The 1,797 real 8x8 images ship inside scikit-learn, so nothing is downloaded. The script

1. splits the data into a training set and a held-out test set (20%, stratified);
2. trains `CNN` with optax's AdamW in one `filter_jit` step that also updates the BatchNorm
   running statistics (`treemod.stateful`), showing a tqdm progress bar with the running loss;
3. reports the compile time (trace + lower + XLA compile of the step) apart from the training time;
4. saves a checkpoint with `treemod.save`, builds a fresh skeleton with `treemod.filter_eval_shape`
   (no parameters are allocated), loads the checkpoint into it with `treemod.load` and evaluates
   the restored model in inference mode on the test set.

Run it with `make demo`, or:

    python examples/digits_cnn.py            # full run: >= 97% test accuracy
    python examples/digits_cnn.py --quick    # a few steps, checks the pipeline end to end
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import treemod as tm
import treemod.nn as nn


class CNN(tm.Module):
    """Two 3x3 convolutions with BatchNorm (the second of stride 2), dropout and a classifier."""

    conv1: nn.Conv2d
    norm1: nn.BatchNorm
    conv2: nn.Conv2d
    norm2: nn.BatchNorm
    dropout: nn.Dropout
    head: nn.Linear

    def __init__(self, *, key: PRNGKeyArray, width: int = 32, dropout: float = 0.25) -> None:
        key1, key2, key3 = jax.random.split(key, 3)
        self.conv1 = nn.Conv2d(1, width, 3, padding=1, key=key1)
        self.norm1 = nn.BatchNorm(width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, key=key2)  # 8x8 -> 4x4
        self.norm2 = nn.BatchNorm(2 * width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width * 4 * 4, 10, key=key3)

    def __call__(
        self, x: Float[Array, "*batch 1 8 8"], *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "*batch 10"]:
        x = jax.nn.relu(self.norm1(self.conv1(x)))
        x = jax.nn.relu(self.norm2(self.conv2(x)))
        x = x.reshape(*x.shape[:-3], -1)
        return self.head(self.dropout(x, key=key))


def cross_entropy(logits: Float[Array, "n 10"], labels: Int[Array, " n"]) -> Float[Array, ""]:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def make_step(optimiser: optax.GradientTransformation) -> Any:
    @tm.filter_jit
    def step(model: CNN, opt_state: Any, x: Array, y: Array, key: PRNGKeyArray) -> Any:
        def loss_fn(model: CNN) -> tuple[Array, CNN]:
            logits, model = tm.stateful(model)(x, key=key)  # also returns the new BatchNorm stats
            return cross_entropy(logits, y), model

        (loss, new_model), grads = tm.filter_value_and_grad(loss_fn, has_aux=True)(model)
        updates, opt_state = optimiser.update(grads, opt_state, tm.filter(model, tm.is_param))
        return tm.apply_updates(new_model, updates), opt_state, loss

    return step


@tm.filter_jit
def predict(model: CNN, x: Float[Array, "n 1 8 8"]) -> Int[Array, " n"]:
    return jnp.argmax(model(x), axis=-1)


def accuracy(model: CNN, x: Array, y: Array) -> float:
    """Test accuracy of `model` (switched to inference mode: running stats, no dropout)."""
    return float(jnp.mean(predict(nn.inference_mode(model), x) == y))


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (1797, 1, 8, 8), channels first
    labels = digits.target.astype(np.int32)
    return train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels)


FULL_EPOCHS = 20
TARGET = 0.97  # test accuracy of the default run


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="8 steps of a narrow model, to test the pipeline"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=FULL_EPOCHS,
        help=f"passes over the training set ({FULL_EPOCHS} reach the {TARGET * 100:.0f}%% target)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="images per training step")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak learning rate")
    parser.add_argument("--seed", type=int, default=0, help="data split, model and dropout seed")
    default_checkpoint = pathlib.Path("checkpoints/digits_cnn.safetensors")
    parser.add_argument(
        "--checkpoint",
        type=pathlib.Path,
        default=default_checkpoint,
        help="where to save the trained model",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    x_train, x_test, y_train, y_test = load_data(args.seed)
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels")
    steps_per_epoch = len(x_train) // args.batch_size  # drop the ragged batch: one shape, one trace
    num_steps = 8 if args.quick else args.epochs * steps_per_epoch

    key = jax.random.key(args.seed)
    model_key, data_key, dropout_key = jax.random.split(key, 3)
    model = CNN(key=model_key, width=8 if args.quick else 32)
    print(tm.tree_summary(model))  # print(model) shows the whole tree
    schedule = optax.cosine_decay_schedule(args.lr, num_steps)
    optimiser = optax.adamw(schedule, weight_decay=1e-4)
    opt_state = optimiser.init(tm.filter(model, tm.is_param))
    step = make_step(optimiser)

    x_train_device, y_train_device = jnp.asarray(x_train), jnp.asarray(y_train)
    rng = np.random.default_rng(args.seed)

    def batches() -> Any:
        while True:
            order = rng.permutation(len(x_train))
            for i in range(steps_per_epoch):
                index = order[i * args.batch_size : (i + 1) * args.batch_size]
                yield x_train_device[index], y_train_device[index]

    data = batches()
    step_keys = jax.random.split(dropout_key, num_steps)

    # Compile ahead of time on the first batch's shapes, so the compile time is reported apart.
    x, y = next(data)
    t0 = time.perf_counter()
    step.lower(model, opt_state, x, y, step_keys[0]).compile()
    compile_time = time.perf_counter() - t0

    t0 = time.perf_counter()
    running = None
    losses = []
    bar = tqdm(range(num_steps), desc="training", unit="step", disable=args.no_progress)
    for i in bar:
        if i > 0:
            x, y = next(data)
        model, opt_state, loss = step(model, opt_state, x, y, step_keys[i])
        if i % 10 == 9 or i == num_steps - 1:  # reading the loss waits for the step: not every step
            value = float(loss)
            losses.append(value)
            running = value if running is None else 0.8 * running + 0.2 * value
            bar.set_postfix(loss=f"{running:.4f}")
    jax.block_until_ready(model)
    bar.close()
    train_time = time.perf_counter() - t0
    test_accuracy = accuracy(model, jnp.asarray(x_test), jnp.asarray(y_test))

    # Save, rebuild an abstract skeleton (shapes and dtypes only), load into it, evaluate.
    args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    tm.save(args.checkpoint, model)
    skeleton = tm.filter_eval_shape(CNN, key=jax.random.key(0), width=8 if args.quick else 32)
    restored = tm.load(args.checkpoint, skeleton)
    restored_accuracy = accuracy(restored, jnp.asarray(x_test), jnp.asarray(y_test))
    if restored_accuracy != test_accuracy:
        raise RuntimeError(
            f"the restored model scores {restored_accuracy:.4f}, "
            f"the trained one {test_accuracy:.4f}"
        )

    total = time.perf_counter() - start
    print(f"compile (trace + lower + XLA compile of the step): {compile_time:.2f} s")
    rate = num_steps / train_time
    print(f"training: {num_steps} steps in {train_time:.2f} s ({rate:.0f} steps/s)")
    print(f"final training loss (running): {running:.4f}")
    print(f"checkpoint: {args.checkpoint} ({args.checkpoint.stat().st_size / 1024:.0f} KiB)")
    print(f"test accuracy of the restored checkpoint: {restored_accuracy:.4f}")
    print(f"total time (data, model, compile, training, checkpoint, evaluation): {total:.2f} s")
    # The target is reported, not enforced: fewer epochs (or --quick) fall short by design.
    verdict = "reaches" if test_accuracy >= TARGET else "is below"
    print(
        f"test accuracy {test_accuracy:.2%} {verdict} the {TARGET:.0%} target "
        f"(met by the full run: {FULL_EPOCHS} epochs, no --quick)"
    )
    return {
        "compile_time": compile_time,
        "train_time": train_time,
        "total_time": total,
        "final_loss": float(running),
        "first_loss": losses[0],
        "test_accuracy": test_accuracy,
        "restored_accuracy": restored_accuracy,
    }


if __name__ == "__main__":
    main()
