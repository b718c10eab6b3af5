"""ONNX export of the zoo's text families with jax2onnx, run by onnxruntime (test_onnx.py has
GPT-2, BERT and the image models; conftest.py the `onnx` fixture).

Each family is converted once with a symbolic batch and sequence length, written to a `.onnx`
file and run by onnxruntime at two shapes; the outputs must equal the jitted model's within
float32 rounding. Their numerics against transformers: tests/models/."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import treemod.models as tmm
import treemod.nn as nn

pytestmark = pytest.mark.slow

# A symbolic batch and length; learned position tables (64 or 70 rows) need the length bounded.
(B, S) = export.symbolic_shape("B, S", constraints=["S <= 64"])
TEXT_SPEC = jax.ShapeDtypeStruct((B, S), jnp.int32)
TEXT_INPUTS = [
    np.random.default_rng(1).integers(0, 64, s).astype(np.int32) for s in [(2, 5), (1, 9)]
]
ENCODER = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
SMALL = {**ENCODER, "num_key_value_heads": 2}

# The zoo's other text families: positions, causal masks and relative buckets for a symbolic
# length (tests/models/test_export_zoo.py's configurations). Mixtral converts, but onnxruntime
# refuses its graph even at fixed shapes (an `Expand` of incompatible dimensions in jax2onnx's
# lowering): docs/seeing-and-shipping.md lists it among the limits.
FAMILIES: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": SMALL,
    "MistralForCausalLM": {**SMALL, "sliding_window": 4},
    "Gemma2ForCausalLM": {**SMALL, "head_dim": 8},
    "RobertaModel": {**ENCODER, "max_position_embeddings": 70, "pad_token_id": 1},
    "DistilBertModel": {
        "vocab_size": 64,
        "dim": 32,
        "hidden_dim": 48,
        "n_layers": 2,
        "n_heads": 4,
        "max_position_embeddings": 64,
    },
    "MPNetModel": {**ENCODER, "max_position_embeddings": 70},
    "ModernBertModel": {**ENCODER, "pad_token_id": 0},
    "T5EncoderModel": {
        "vocab_size": 64,
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 48,
        "num_layers": 2,
        "num_heads": 4,
    },
}


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_zoo_text_family_exported_with_symbolic_length_runs_in_onnxruntime(
    onnx: SimpleNamespace, tmp_path: Path, arch: str
) -> None:
    cls = tmm.registered_architectures()[arch]
    model = nn.inference_mode(cls.from_config(FAMILIES[arch], key=jax.random.key(0)))
    fn = lambda ids: model(input_ids=ids)  # noqa: E731
    shape, got = onnx.run_exported(tmp_path, fn, TEXT_SPEC, TEXT_INPUTS)
    assert shape == ["B", "S"]
    onnx.assert_equals_jitted(fn, TEXT_INPUTS, got)
