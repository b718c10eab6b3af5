"""`jax.export` of zoo models with a symbolic batch and sequence length: the exported program
runs at other shapes with the jitted model's outputs. Learned position tables need the length
bounded by a constraint, and say so; DeBERTa-v2's log buckets need a fixed length only where
they do not grow to the span, and say so."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import treemod as tm
import treemod.models as tmm

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
ENCODER = {k: v for k, v in SMALL.items() if k != "num_key_value_heads"}
CASES: dict[str, dict[str, Any]] = {
    "GPT2LMHeadModel": {
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 4,
        "vocab_size": 64,
        "n_positions": 64,
    },
    "LlamaForCausalLM": SMALL,
    "MistralForCausalLM": {**SMALL, "sliding_window": 4},
    "Gemma2ForCausalLM": {**SMALL, "head_dim": 8},
    "MixtralForCausalLM": {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    "BertModel": ENCODER,
    "RobertaModel": {**ENCODER, "max_position_embeddings": 70, "pad_token_id": 1},
    "MPNetModel": {**ENCODER, "max_position_embeddings": 70},
    "ModernBertModel": {**ENCODER, "pad_token_id": 0},
    "T5EncoderModel": {
        "vocab_size": 64,
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
    },  # fmt: skip
}


def _model(arch: str) -> Any:
    cls = tmm.registered_architectures()[arch]
    return tm.nn.inference_mode(cls.from_config(CASES[arch], key=jax.random.key(0)))


@pytest.mark.parametrize("arch", list(CASES))
def test_exported_with_symbolic_batch_and_length_runs_at_other_shapes(arch: str) -> None:
    model = _model(arch)
    run = jax.jit(lambda x: model(input_ids=x))
    batch, seq = export.symbolic_shape("batch, seq", constraints=["seq <= 60"])
    exported = export.export(run)(jax.ShapeDtypeStruct((batch, seq), jnp.int32))
    for shape in ((2, 5), (1, 9)):
        ids = np.random.default_rng(0).integers(2, 60, shape).astype(np.int32)
        np.testing.assert_allclose(np.asarray(exported.call(ids)), run(ids), rtol=1e-5, atol=1e-5)


def test_an_unbounded_length_over_a_position_table_is_named() -> None:
    model = _model("BertModel")
    batch, seq = export.symbolic_shape("batch, seq")
    with pytest.raises(ValueError, match=r"BertModel: the symbolic sequence length seq is not "
                       r"bounded.*constraints=\['seq <= 64'\]"):  # fmt: skip
        export.export(jax.jit(lambda x: model(input_ids=x)))(
            jax.ShapeDtypeStruct((batch, seq), jnp.int32)
        )


def test_deberta_needs_a_fixed_length_only_where_its_buckets_shrink_and_says_so() -> None:
    # 256 buckets over 64 positions: the log part shrinks, so no finite table serves.
    config = {**ENCODER, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
              "position_buckets": 256, "max_relative_positions": 64}  # fmt: skip
    model = tm.nn.inference_mode(tmm.DebertaV2Model.from_config(config, key=jax.random.key(0)))
    batch, seq = export.symbolic_shape("batch, seq", constraints=["seq <= 60"])
    with pytest.raises(
        ValueError,
        match=r"DeBERTa-v2: with position_buckets=256 and max_relative_positions=64 .*"
        r"export with a fixed sequence length",
    ):
        export.export(jax.jit(lambda x: model(input_ids=x)))(
            jax.ShapeDtypeStruct((batch, seq), jnp.int32)
        )
    (batch,) = export.symbolic_shape("batch")
    exported = export.export(jax.jit(lambda x: model(input_ids=x)))(
        jax.ShapeDtypeStruct((batch, 7), jnp.int32)
    )
    ids = np.arange(21, dtype=np.int32).reshape(3, 7)
    np.testing.assert_allclose(exported.call(ids), model(input_ids=ids), rtol=1e-5, atol=1e-5)
