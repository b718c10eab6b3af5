"""Every zoo family under the sharding presets on 8 fake CPU devices: outputs equal one
device's (within 1e-5), and attention, MLP and vocabulary weights split the way the Megatron
layout of `treemod/models/_axis_layouts.py` says (attention by heads, output projections and
MLP down projections by their input, vocabulary tables by rows, position tables whole)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from sharding_models import mesh

import treemod as tm
import treemod.models as tmm

TP = (tm.tensor_parallel_rules(), (1, 8))
FSDP = (tm.fsdp_rules(), (8, 1))
RNG = np.random.default_rng(0)
IDS = RNG.integers(2, 64, (2, 8))
PIXELS = RNG.normal(size=(2, 3, 16, 16)).astype(np.float32)
# Sizes every preset divides on 8 devices: 8 heads of 4, MLP 64, vocabulary 64.
TEXT = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "max_position_embeddings": 32,
}
DECODER = {**TEXT, "num_key_value_heads": 8}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "image_size": 16,
    "patch_size": 4,
}


def ids(**extra: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {"input_ids": IDS, **extra}


# name: (class, config, inputs, {path in the TP-sharded model: its spec})
Case = tuple[Any, dict[str, Any], Callable[[], dict[str, Any]], dict[str, P]]
BERT_LAYOUT = {
    "bert.encoder.layer.layers.attention.self.query.weight": P(None, "model"),
    "bert.encoder.layer.layers.attention.output.dense.weight": P(None, None, "model"),
    "bert.encoder.layer.layers.output.dense.weight": P(None, None, "model"),
    "bert.embeddings.position_embeddings.weight": P(),
    "cls.predictions.bias": P("model"),
}
LLAMA_LAYOUT = {
    "model.layers.layers.self_attn.q_proj.weight": P(None, "model"),
    "model.layers.layers.self_attn.o_proj.weight": P(None, None, "model"),
    "model.layers.layers.mlp.down_proj.weight": P(None, None, "model"),
    "model.embed_tokens.weight": P("model"),
}
CASES: dict[str, Case] = {
    "bert": (tmm.BertForMaskedLM, TEXT, ids(), BERT_LAYOUT),
    "roberta": (
        tmm.RobertaForMaskedLM,
        {**TEXT, "pad_token_id": 1, "max_position_embeddings": 40},
        ids(),
        {"lm_head.bias": P("model"), "lm_head.dense.weight": P("model")},
    ),
    "xlm-roberta": (
        tmm.XLMRobertaModel,
        {**TEXT, "pad_token_id": 1, "max_position_embeddings": 40},
        ids(),
        {"encoder.layer.layers.attention.output.dense.weight": P(None, None, "model")},
    ),
    "distilbert": (
        tmm.DistilBertForMaskedLM,
        {"vocab_size": 64, "dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 8},
        ids(),
        {
            "distilbert.transformer.layer.layers.attention.out_lin.weight": P(None, None, "model"),
            "distilbert.transformer.layer.layers.ffn.lin2.weight": P(None, None, "model"),
            "vocab_projector.bias": P("model"),
        },
    ),
    "mpnet": (
        tmm.MPNetForMaskedLM,
        {**TEXT, "max_position_embeddings": 40},
        ids(),
        {
            "mpnet.encoder.layer.layers.attention.attn.o.weight": P(None, None, "model"),
            "mpnet.encoder.relative_attention_bias.weight": P(),
        },
    ),
    "deberta-v2": (
        tmm.DebertaV2ForMaskedLM,
        {**TEXT, "relative_attention": True, "pos_att_type": ["p2c", "c2p"]},
        ids(),
        {
            "deberta.encoder.layer.layers.attention.self.query_proj.weight": P(None, "model"),
            "deberta.encoder.layer.layers.attention.output.dense.weight": P(None, None, "model"),
        },
    ),
    "modernbert": (
        tmm.ModernBertForMaskedLM,
        {**TEXT, "pad_token_id": 0},
        ids(),
        {
            "model.layers.0.attn.Wqkv.weight": P("model"),
            "model.layers.0.attn.Wo.weight": P(None, "model"),
            "model.layers.0.mlp.Wo.weight": P(None, "model"),
        },
    ),
    "t5": (
        tmm.T5ForConditionalGeneration,
        {"vocab_size": 64, "d_model": 32, "d_kv": 4, "d_ff": 64, "num_layers": 2, "num_heads": 8},
        ids(decoder_input_ids=IDS[:, :5]),
        {"shared.weight": P("model")},  # the head is tied to it
    ),
    "whisper": (
        tmm.WhisperForConditionalGeneration,
        {
            "vocab_size": 64,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 8,
            "decoder_attention_heads": 8,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "num_mel_bins": 8,
            "max_source_positions": 8,
            "max_target_positions": 16,
        },
        lambda: {
            "input_features": RNG.normal(size=(2, 8, 16)).astype(np.float32),
            "decoder_input_ids": IDS[:, :5],
        },
        {
            "model.decoder.embed_tokens.weight": P("model"),  # the head is tied to it
            "model.encoder.embed_positions.weight": P(),
        },
    ),
    "wav2vec2": (
        tmm.Wav2Vec2ForCTC,
        {
            **VISION,
            "vocab_size": 64,
            "conv_dim": [8, 16],
            "conv_stride": [4, 2],
            "conv_kernel": [8, 3],
            "num_conv_pos_embeddings": 6,
            "num_conv_pos_embedding_groups": 2,
        },
        lambda: {"input_values": RNG.normal(size=(2, 200)).astype(np.float32)},
        {"lm_head.weight": P("model")},
    ),
    "vit": (
        tmm.ViTModel,
        VISION,
        lambda: {"pixel_values": PIXELS},
        {"layers.layers.attention.o_proj.weight": P(None, None, "model")},
    ),
    "dinov2": (
        tmm.Dinov2Model,
        {**VISION, "mlp_ratio": 2, "use_swiglu_ffn": True},
        lambda: {"pixel_values": PIXELS},
        {"encoder.layer.layers.mlp.weights_out.weight": P(None, None, "model")},
    ),
    "clip": (
        tmm.CLIPTextModel,
        {**TEXT, "max_position_embeddings": 8},
        ids(),
        {"encoder.layers.layers.self_attn.out_proj.weight": P(None, None, "model")},
    ),
    "siglip": (
        tmm.SiglipVisionModel,
        VISION,
        lambda: {"pixel_values": PIXELS},
        {"head.attention.in_proj_weight": P("model"), "head.mlp.fc2.weight": P(None, "model")},
    ),
    "convnext": (
        tmm.ConvNextModel,
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2},
        lambda: {"pixel_values": PIXELS},
        {"encoder.stages.0.layers.layers.pwconv2.weight": P(None, None, "model")},
    ),
    "resnet": (
        tmm.ResNetModel,
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]},
        lambda: {"pixel_values": PIXELS},
        {"embedder.embedder.convolution.weight": P("model")},
    ),
    "llama": (tmm.LlamaForCausalLM, DECODER, ids(), LLAMA_LAYOUT),
    "mistral": (tmm.MistralForCausalLM, {**DECODER, "sliding_window": 4}, ids(), LLAMA_LAYOUT),
    "qwen3": (tmm.Qwen3ForCausalLM, {**DECODER, "head_dim": 4}, ids(), LLAMA_LAYOUT),
    "gemma2": (tmm.Gemma2ForCausalLM, {**DECODER, "head_dim": 4}, ids(), LLAMA_LAYOUT),
    "phi3": (
        tmm.Phi3ForCausalLM,
        {**DECODER, "pad_token_id": 0},
        ids(),
        {
            "model.layers.layers.self_attn.qkv_proj.weight": P(None, "model"),
            "model.layers.layers.self_attn.o_proj.weight": P(None, None, "model"),
            "model.layers.layers.mlp.gate_up_proj.weight": P(None, "model"),
        },
    ),
    "mixtral": (
        tmm.MixtralForCausalLM,
        {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
        ids(),
        {
            "model.layers.layers.mlp.experts.gate_up_proj": P(None, None, "model"),
            "model.layers.layers.mlp.experts.down_proj": P(None, None, None, "model"),
        },
    ),
}


def _get(model: Any, path: str) -> Any:
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def _run(model: Any, inputs: dict[str, Any]) -> list[np.ndarray]:
    out = tm.filter_jit(lambda m, x: m(**x))(model, inputs)
    return [np.asarray(x) for x in jax.tree.leaves(out)]


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Any, dict[str, Any], list[np.ndarray]]]:
    out = {}
    for name, (cls, config, inputs, _) in CASES.items():
        model = tm.nn.inference_mode(cls.from_config(config, key=jax.random.key(0)))
        x = inputs()
        out[name] = (model, x, _run(model, x))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_family_outputs_equal_one_devices(built: Any, name: str) -> None:
    """Tensor parallel and FSDP, each against one device; both sharded models run in one
    compiled program (one compile instead of two)."""
    model, inputs, want = built[name]
    presets = {"tp": TP, "fsdp": FSDP}
    sharded = {
        preset: tm.shard(model, mesh(shape, ("data", "model")), rules)
        for preset, (rules, shape) in presets.items()
    }
    outs = tm.filter_jit(lambda models, x: {k: m(**x) for k, m in models.items()})(sharded, inputs)
    for preset in presets:
        got = [np.asarray(x) for x in jax.tree.leaves(outs[preset])]
        assert len(got) == len(want), preset
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=preset)


@pytest.mark.parametrize("name", list(CASES))
def test_family_tensor_parallel_layout(built: Any, name: str) -> None:
    model = built[name][0]
    sharded = tm.shard(model, mesh((1, 8), ("data", "model")), tm.tensor_parallel_rules())
    for path, spec in CASES[name][3].items():
        assert _get(sharded, path).sharding.spec == spec, path


def test_fsdp_splits_every_large_weight_by_its_first_divisible_axis(built: Any) -> None:
    model = built["mixtral"][0]
    sharded = tm.shard(model, mesh((8, 1), ("data", "model")), tm.fsdp_rules())
    experts = sharded.model.layers.layers.mlp.experts
    # (layers, experts=4, 2 * mlp, embed): 4 experts do not divide 8 devices, the MLP axis does
    assert experts.gate_up_proj.sharding.spec == P(None, None, "data")
    assert sharded.model.embed_tokens.weight.sharding.spec == P("data")


def test_an_indivisible_head_axis_names_the_array_and_rule(built: Any) -> None:
    # 6 heads of 6 (36 rows) over 8 devices, with no fallback rule for `heads`.
    model = tmm.BertModel.from_config(
        {**TEXT, "num_attention_heads": 6, "hidden_size": 36}, key=jax.random.key(0)
    )
    with pytest.raises(tm.ShardingError) as info:
        tm.shard(model, mesh((8,), ("model",)), [("heads", "model")])
    message = str(info.value)
    assert "encoder.layer.layers.attention.self.query.weight" in message
    assert "'heads'" in message and "size 36" in message and "('heads', None)" in message
