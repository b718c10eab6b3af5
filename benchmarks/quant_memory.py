"""Memory of a QLoRA training step against a bf16 LoRA step, from XLA's `memory_analysis()`.

The model is a Llama with TinyLlama-1.1B's shape (22 layers, width 2048, MLP 5632, 32 heads, 4
key-value heads, vocabulary 32000), built abstractly (`filter_eval_shape`: no weights are
allocated and no forward runs). Both steps adapt every linear layer of the decoder with r=16,
compute in bf16, and update the adapters with optax's AdamW on a batch of 1 x 512 tokens; the
QLoRA step's base is NF4 (block 64, double quantisation), the LoRA step's is bf16. Each runs
without and with rematerialisation of the decoder layers (`Stack(remat=True)`: only each layer's
input is kept for the backward pass). Each step is compiled with
`jax.jit(...).lower(...).compile()`, and the figures are XLA's: arguments (parameters, optimiser
state, tokens), temporaries, and their sum. Target (issue 49): QLoRA's arguments + temporaries
at most 1.6 GB. Not timed, so `benchmarks/timing.py` is not used.

    python -m benchmarks.quant_memory
"""

from __future__ import annotations

import time
from typing import Any

TINYLLAMA = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOKENS = 512


def _model(quantised: bool, remat: bool) -> Any:
    """The abstract model with adapters (`ShapeDtypeStruct` leaves)."""
    import jax
    import jax.numpy as jnp

    import treemod as tm
    import treemod.lora as lora
    import treemod.quant as quant
    from treemod.models.llama import LlamaForCausalLM

    def build() -> Any:
        model = LlamaForCausalLM.from_config(TINYLLAMA, key=jax.random.key(0), dtype=jnp.bfloat16)
        if quantised:
            model = quant.quantise(model, TARGETS, "nf4")
        return lora.add_lora(model, TARGETS, r=16, alpha=32, key=jax.random.key(1))

    model = tm.filter_eval_shape(build)
    layers = object.__new__(type(model.model.layers))
    # `remat` is a static field, which `tree_at` does not set; the rest of the Stack is shared.
    layers.__dict__.update(model.model.layers.__dict__, remat=remat)
    return tm.tree_at(lambda m: m.model.layers, model, layers)


def measure(quantised: bool, remat: bool) -> dict[str, float]:
    """XLA's byte counts for one compiled training step, and the compile time in seconds."""
    import jax
    import jax.numpy as jnp
    import optax

    import treemod as tm
    import treemod.lora as lora

    model = _model(quantised, remat)
    adapters, frozen = tm.partition(model, lora.trainable(model))
    frozen_arrays, static = tm.partition(frozen, tm.is_array)
    optimiser = optax.adamw(1e-4)
    opt_state = jax.eval_shape(optimiser.init, adapters)

    def step(adapters: Any, frozen_arrays: Any, opt_state: Any, ids: Any) -> Any:
        def loss(adapters: Any) -> Any:
            m = tm.combine(adapters, frozen_arrays, static)
            logits = m(input_ids=ids[:, :-1]).astype(jnp.float32)
            picked = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1)
            return -jnp.mean(picked)

        value, grads = jax.value_and_grad(loss)(adapters)
        updates, opt_state = optimiser.update(grads, opt_state, adapters)
        return optax.apply_updates(adapters, updates), opt_state, value

    ids = jax.ShapeDtypeStruct((1, TOKENS + 1), jnp.int32)
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(0, 2)).lower(adapters, frozen_arrays, opt_state, ids)
    stats = compiled.compile().memory_analysis()
    seconds = time.perf_counter() - start
    assert stats is not None, "this backend gives no memory_analysis()"
    arguments, temporaries = stats.argument_size_in_bytes, stats.temp_size_in_bytes
    return {
        "arguments": arguments,
        "temporaries": temporaries,
        "outputs": stats.output_size_in_bytes,
        "arguments+temporaries": arguments + temporaries,
        "compile_s": seconds,
    }


def main() -> None:
    rows = {
        f"{name}{' remat' if remat else ''}": measure(quantised, remat)
        for remat in (False, True)
        for name, quantised in (("QLoRA", True), ("LoRA", False))
    }
    print(f"{'step':<18}" + "".join(f"{k:>24}" for k in next(iter(rows.values()))))
    for name, row in rows.items():
        cells = [
            f"{v / 2**30:21.3f} GiB" if k != "compile_s" else f"{v:22.1f} s" for k, v in row.items()
        ]
        print(f"{name:<18}" + "".join(f"{c:>24}" for c in cells))
    for suffix in ("", " remat"):
        q, b = rows["QLoRA" + suffix], rows["LoRA" + suffix]
        total = q["arguments+temporaries"]
        ratio = total / b["arguments+temporaries"]
        verdict = "met" if total <= 1.6e9 else "missed"
        print(f"QLoRA{suffix} / LoRA{suffix} (arguments + temporaries): {ratio:.3f}; QLoRA "
              f"{total / 1e9:.3f} GB (target <= 1.6 GB: {verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
