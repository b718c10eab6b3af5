"""`jax.export` of the zoo families `test_export_zoo.py` leaves out: every family exports with
a symbolic batch, and with a symbolic length wherever its input has one (tokens, decoder
tokens, audio samples, image height and width for the convolutional networks); the exported
program runs at two other shapes with the jitted model's outputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import treemod as tm
import treemod.models as tmm

LM = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "head_dim": 8,
}
ENCODER = {k: v for k, v in LM.items() if k not in ("num_key_value_heads", "head_dim")}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
}
TEXT = {**ENCODER, "max_position_embeddings": 12, "eos_token_id": 63, "pad_token_id": 1}
DISTILBERT = {"vocab_size": 64, "dim": 32, "hidden_dim": 48, "n_layers": 2, "n_heads": 4}
DEBERTA = {
    **ENCODER,
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_buckets": 8,
    "position_biased_input": False,
}
T5 = {"vocab_size": 64, "d_model": 16, "d_kv": 4, "d_ff": 24, "num_layers": 2, "num_heads": 4}
WHISPER = {
    "vocab_size": 64,
    "d_model": 16,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 24,
    "decoder_ffn_dim": 24,
    "num_mel_bins": 8,
    "max_source_positions": 12,
    "max_target_positions": 30,
}
WAV2VEC2 = {
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 24,
    "conv_dim": [8, 12],
    "conv_stride": [4, 2],
    "conv_kernel": [8, 3],
    "num_conv_pos_embeddings": 6,
    "num_conv_pos_embedding_groups": 2,
    "vocab_size": 20,
}
RESNET = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 2], "num_labels": 3}
CONVNEXT = {"hidden_sizes": [8, 16, 24], "depths": [1, 2, 1], "num_stages": 3, "num_labels": 3}

# The oldest JAX's export is tested by `test_export_zoo.py`; these add families, not JAX paths.
pytestmark = pytest.mark.slow

RNG = np.random.default_rng(0)


def _ids(batch: int, seq: int) -> np.ndarray:
    return RNG.integers(2, 60, (batch, seq)).astype(np.int32)


def _floats(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def _tokens(batch: int, seq: int) -> tuple[np.ndarray, ...]:
    return (_ids(batch, seq),)


def _pixels(size: int) -> Callable[[int, int], tuple[np.ndarray, ...]]:
    return lambda batch, _: (_floats(batch, 3, size, size),)


# arch: (config, the symbolic inputs' spec and constraints, input names, inputs at two shapes)
Case = tuple[dict[str, Any], str, list[str], list[str], list[tuple[Any, ...]]]
CASES: dict[str, Case] = {
    "Phi3ForCausalLM": (LM, "b, s", ["s <= 60"], ["input_ids"], [_tokens(2, 5), _tokens(1, 9)]),
    "Qwen2ForCausalLM": (LM, "b, s", ["s <= 60"], ["input_ids"], [_tokens(2, 5), _tokens(1, 9)]),
    "Qwen3ForCausalLM": (LM, "b, s", ["s <= 60"], ["input_ids"], [_tokens(2, 5), _tokens(1, 9)]),
    "GemmaForCausalLM": (LM, "b, s", ["s <= 60"], ["input_ids"], [_tokens(2, 5), _tokens(1, 9)]),
    "Gemma3ForCausalLM": (
        {**LM, "sliding_window": 4},
        "b, s",
        ["s <= 60"],
        ["input_ids"],
        [_tokens(2, 5), _tokens(1, 9)],
    ),
    "XLMRobertaForMaskedLM": (
        {**ENCODER, "max_position_embeddings": 70, "pad_token_id": 1},
        "b, s",
        ["s <= 60"],
        ["input_ids"],
        [_tokens(2, 5), _tokens(1, 9)],
    ),
    "DistilBertForSequenceClassification": (
        {**DISTILBERT, "max_position_embeddings": 64},
        "b, s",
        ["s <= 60"],
        ["input_ids"],
        [_tokens(2, 5), _tokens(1, 9)],
    ),
    "DebertaV2ForTokenClassification": (
        DEBERTA,
        "b, s",
        [],
        ["input_ids"],
        [_tokens(2, 5), _tokens(1, 90)],
    ),
    "T5ForConditionalGeneration": (
        T5,
        "b, s, t",
        [],
        ["input_ids", "decoder_input_ids"],
        [(_ids(2, 5), _ids(2, 3)), (_ids(1, 9), _ids(1, 7))],
    ),
    "WhisperForConditionalGeneration": (
        WHISPER,
        "b, t",
        ["t <= 30"],
        ["input_features", "decoder_input_ids"],
        [(_floats(2, 8, 24), _ids(2, 3)), (_floats(1, 8, 24), _ids(1, 7))],
    ),
    "Wav2Vec2ForCTC": (
        WAV2VEC2,
        "b, n",
        ["n >= 16"],
        ["input_values"],
        [(_floats(2, 200),), (_floats(1, 333),)],
    ),
    "ViTForImageClassification": (
        {**VISION, "num_labels": 3},
        "b",
        [],
        ["pixel_values"],
        [_pixels(16)(2, 0), _pixels(16)(1, 0)],
    ),
    "Dinov2ForImageClassification": (
        {**VISION, "mlp_ratio": 2, "num_labels": 3},
        "b",
        [],
        ["pixel_values"],
        [_pixels(16)(2, 0), _pixels(16)(1, 0)],
    ),
    "CLIPModel": (
        {"text_config": {**TEXT, "projection_dim": 8}, "vision_config": VISION},
        "b, s, images",
        ["s <= 12"],
        ["input_ids", "pixel_values"],
        [(_ids(2, 5), _floats(3, 3, 16, 16)), (_ids(1, 9), _floats(1, 3, 16, 16))],
    ),
    "SiglipModel": (
        {"text_config": TEXT, "vision_config": VISION},
        "b, s, images",
        ["s <= 12"],
        ["input_ids", "pixel_values"],
        [(_ids(2, 5), _floats(3, 3, 16, 16)), (_ids(1, 9), _floats(1, 3, 16, 16))],
    ),
    "ResNetForImageClassification": (
        RESNET,
        "b, h, w",
        [],
        ["pixel_values"],
        [(_floats(2, 3, 32, 32),), (_floats(1, 3, 40, 24),)],
    ),
    # The stem's 4x4 patches: without the bounds XLA's shape checks cannot tell that
    # `(h - 4) // 4` is not negative.
    "ConvNextForImageClassification": (
        CONVNEXT,
        "b, h, w",
        ["h >= 32", "w >= 32"],
        ["pixel_values"],
        [(_floats(2, 3, 32, 32),), (_floats(1, 3, 64, 32),)],
    ),
}
# The dimensions of each input, by name, in the spec's symbols (fixed ones as numbers).
SHAPES = {
    "input_ids": ("b", "s"),
    "decoder_input_ids": ("b", "t"),
    "input_features": ("b", 8, 24),
    "input_values": ("b", "n"),
}


def _spec(name: str, dims: dict[str, Any]) -> jax.ShapeDtypeStruct:
    if name == "pixel_values":
        batch = dims.get("images", dims["b"])
        height, width = (dims["h"], dims["w"]) if "h" in dims else (16, 16)
        return jax.ShapeDtypeStruct((batch, 3, height, width), jnp.float32)
    shape = tuple(dims[d] if isinstance(d, str) else d for d in SHAPES[name])
    dtype = jnp.int32 if name.endswith("ids") else jnp.float32
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("arch", list(CASES))
def test_every_family_exports_with_symbolic_dimensions(arch: str) -> None:
    config, spec, constraints, names, calls = CASES[arch]
    cls = tmm.registered_architectures()[arch]
    model = tm.nn.inference_mode(cls.from_config(config, key=jax.random.key(0)))
    run = jax.jit(lambda *xs: model(**dict(zip(names, xs, strict=True))))
    symbols = [s.strip() for s in spec.split(",")]
    dims = dict(zip(symbols, export.symbolic_shape(spec, constraints=constraints), strict=True))
    exported = export.export(run)(*(_spec(n, dims) for n in names))
    assert all(not isinstance(d, int) for d in exported.in_avals[0].shape[:1])
    for args in calls:
        jax.tree.map(
            lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5),
            exported.call(*args),
            run(*args),
        )
