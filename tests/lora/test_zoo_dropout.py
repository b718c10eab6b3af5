"""LoRA dropout in every zoo family: each layer `add_lora` can wrap gets a dropout key of its own.

One small model per family, adapters on every `Linear` / `Conv` PEFT could target, random B (so
the adapters change the output). Independent checks: with `lora_dropout=1.0` the adapters'
input is all zeros, so the model computes exactly the base model's output; with 0 < p < 1 the
output depends on the key (and only on it); gradients reach each A.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lora_arrays import randomise_b

import treemod as tm
import treemod.lora as lora
import treemod.models as tmm
from treemod.lora._select import rewrite_named
from treemod.models.gpt2 import Conv1D

TEXT = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
DECODER = {**TEXT, "num_key_value_heads": 2}
ENCODER = {**TEXT, "num_labels": 3}
VISION = {
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 16,
    "patch_size": 4,
    "num_labels": 3,
}
CLIP_TEXT = {**TEXT, "eos_token_id": 63, "bos_token_id": 62, "pad_token_id": 1}
CLIP_VISION = {k: v for k, v in VISION.items() if k != "num_labels"}
SEQ2SEQ = {"vocab_size": 60, "decoder_start_token_id": 0}

IDS = np.array([[2, 5, 9, 3, 7, 12], [4, 4, 8, 10, 11, 13]], dtype=np.int32)
PIXELS = np.random.default_rng(0).normal(size=(2, 3, 16, 16)).astype(np.float32)
AUDIO = np.random.default_rng(1).normal(size=(2, 400)).astype(np.float32)
MEL = np.random.default_rng(2).normal(size=(2, 8, 24)).astype(np.float32)
TEXT_IN = {"input_ids": IDS}
IMAGE_IN = {"pixel_values": PIXELS}

# architecture: (config, inputs)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "GPT2LMHeadModel": ({"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64}, TEXT_IN),
    "LlamaForCausalLM": (DECODER, TEXT_IN),
    "MistralForCausalLM": ({**DECODER, "sliding_window": 4}, TEXT_IN),
    "Qwen2ForCausalLM": (DECODER, TEXT_IN),
    "Qwen3ForCausalLM": ({**DECODER, "head_dim": 8}, TEXT_IN),
    "GemmaForCausalLM": ({**DECODER, "head_dim": 8}, TEXT_IN),
    "Gemma2ForCausalLM": ({**DECODER, "head_dim": 8}, TEXT_IN),
    "Gemma3ForCausalLM": ({**DECODER, "head_dim": 8}, TEXT_IN),
    "Phi3ForCausalLM": ({**DECODER, "pad_token_id": 0}, TEXT_IN),
    "MixtralForCausalLM": (
        {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
        TEXT_IN,
    ),
    "BertForSequenceClassification": (ENCODER, TEXT_IN),
    "RobertaForMaskedLM": ({**ENCODER, "max_position_embeddings": 70, "pad_token_id": 1}, TEXT_IN),
    "XLMRobertaForTokenClassification": (
        {**ENCODER, "max_position_embeddings": 70, "pad_token_id": 1},
        TEXT_IN,
    ),
    "DistilBertForSequenceClassification": (
        {
            "vocab_size": 64,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 48,
            "num_labels": 3,
        },
        TEXT_IN,
    ),  # fmt: skip
    "MPNetForMaskedLM": ({**ENCODER, "max_position_embeddings": 70}, TEXT_IN),
    "DebertaV2ForSequenceClassification": (
        {
            **ENCODER,
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "position_buckets": 8,
            "max_relative_positions": 64,
            "share_att_key": True,
            "norm_rel_ebd": "layer_norm",
            "position_biased_input": False,
        },
        TEXT_IN,
    ),  # fmt: skip
    "ModernBertForSequenceClassification": (
        {
            **ENCODER,
            "local_attention": 4,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "cls_token_id": 1,
            "sep_token_id": 2,
        },
        TEXT_IN,
    ),  # fmt: skip
    "T5ForConditionalGeneration": (
        {
            **SEQ2SEQ,
            "d_model": 16,
            "d_kv": 4,
            "d_ff": 24,
            "num_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 12,
        },
        {"input_ids": IDS, "decoder_input_ids": IDS[:, :4]},
    ),  # fmt: skip
    "WhisperForConditionalGeneration": (
        {
            **SEQ2SEQ,
            "d_model": 16,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 24,
            "decoder_ffn_dim": 20,
            "num_mel_bins": 8,
            "max_source_positions": 12,
            "max_target_positions": 30,
            "decoder_start_token_id": 1,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        {"input_features": MEL, "decoder_input_ids": IDS[:, :4]},
    ),  # fmt: skip
    "Wav2Vec2ForSequenceClassification": (
        {
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
            "classifier_proj_size": 8,
        },
        {"input_values": AUDIO},
    ),  # fmt: skip
    "ViTForImageClassification": (VISION, IMAGE_IN),
    "Dinov2ForImageClassification": ({**VISION, "mlp_ratio": 2}, IMAGE_IN),
    "ConvNextForImageClassification": (
        {"hidden_sizes": [8, 16], "depths": [1, 1], "num_stages": 2, "num_labels": 3},
        IMAGE_IN,
    ),
    "ResNetForImageClassification": (
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3},
        IMAGE_IN,
    ),
    "CLIPModel": (
        {"text_config": CLIP_TEXT, "vision_config": CLIP_VISION, "projection_dim": 8},
        # CLIP pools at the end-of-text token: the last one here (at the first token, which
        # attends only to itself, the queries would get no gradient).
        {
            "input_ids": np.concatenate([IDS[:, :-1], np.full((2, 1), 63, np.int32)], 1),
            "pixel_values": PIXELS,
        },
    ),
    "SiglipModel": (
        {"text_config": CLIP_TEXT, "vision_config": CLIP_VISION},
        {"input_ids": IDS, "pixel_values": PIXELS},
    ),
}
# The heads whose code passes keys of its own (the slow run): same bodies, other heads.
CASES.update(
    {
        name: (CASES[body][0], CASES[body][1])
        for name, body in {
            "DistilBertForMaskedLM": "DistilBertForSequenceClassification",
            "DebertaV2ForMaskedLM": "DebertaV2ForSequenceClassification",
            "ModernBertForMaskedLM": "ModernBertForSequenceClassification",
            "Wav2Vec2ForCTC": "Wav2Vec2ForSequenceClassification",
        }.items()
    }
)
CASES["CLIPTextModelWithProjection"] = (
    {**CLIP_TEXT, "projection_dim": 8},
    {"input_ids": CASES["CLIPModel"][1]["input_ids"]},
)
CASES["CLIPVisionModelWithProjection"] = ({**CLIP_VISION, "projection_dim": 8}, IMAGE_IN)
CASES["CLIPForImageClassification"] = (
    {"text_config": CLIP_TEXT, "vision_config": CLIP_VISION, "num_labels": 3},
    IMAGE_IN,
)
CASES["SiglipForImageClassification"] = (
    {"text_config": CLIP_TEXT, "vision_config": CLIP_VISION, "num_labels": 3},
    IMAGE_IN,
)
CASES["SiglipVisionModel"] = (CLIP_VISION, IMAGE_IN)
CASES["T5ForSequenceClassification"] = (
    {**CASES["T5ForConditionalGeneration"][0], "num_labels": 3},
    {"input_ids": np.concatenate([IDS[:, :-1], np.ones((2, 1), np.int32)], 1)},  # eos: 1
)
CASES["WhisperForAudioClassification"] = (
    {**CASES["WhisperForConditionalGeneration"][0], "num_labels": 3},
    {"input_features": MEL},
)


def wrappable(model: Any) -> list[str]:
    """The names of every layer `add_lora` can wrap (all Linear, Conv and GPT-2's Conv1D)."""
    names: list[str] = []

    def visit(node: Any, name: str) -> Any:
        if isinstance(node, tm.nn.Linear) and "scalar" not in (node.in_features,
                                                                 node.out_features):  # fmt: skip
            names.append(name)
        elif isinstance(node, Conv1D) or (
            isinstance(node, tm.nn.Conv) and node.groups == 1 and node.padding_mode == "ZEROS"
        ):
            names.append(name)
        else:
            return None
        return node  # found: not looked into

    rewrite_named(model, visit)
    return names


def lora_training(model: Any) -> Any:
    """`model` with its adapters' dropouts in training mode (the base as loaded: inference)."""

    def one(layer: Any) -> Any:
        return tm.tree_at(lambda m: m.lora_dropout, layer, tm.nn.Dropout(layer.lora_dropout.p))

    return jax.tree_util.tree_map(
        lambda x: one(x) if lora.is_lora_layer(x) else x, model, is_leaf=lora.is_lora_layer
    )


_MODELS: dict[str, Any] = {}


def base(arch: str) -> Any:
    if arch not in _MODELS:
        config, _ = CASES[arch]
        cls = tmm.registered_architectures()[arch]
        _MODELS[arch] = cls.from_config(config, key=jax.random.key(0))
    return _MODELS[arch]


# Layers a model holds but its call does not run (transformers' too): SigLIP's pooling head
# serves `pooler_output` only.
UNUSED = {"SiglipForImageClassification": "vision_model.head.", "SiglipVisionModel": "head."}


def tuned(arch: str, p: float) -> Any:
    model = base(arch)
    unused = UNUSED.get(arch, "\0")
    targets = [n for n in wrappable(model) if not n.startswith(unused)]
    adapted = lora.add_lora(model, targets, r=4, alpha=8, dropout=p, key=jax.random.key(1))
    return lora_training(randomise_b(adapted))


def base_and_dropped(arch: str) -> Callable[..., Any]:
    """`(base model, other model, key) -> both outputs at the key`, one compiled program."""
    _, inputs = CASES[arch]
    return tm.filter_jit(lambda b, m, key: (b(**inputs, key=key), m(**inputs, key=key)))


def lora_layers(model: Any) -> list[Any]:
    found = jax.tree_util.tree_leaves(model, is_leaf=lora.is_lora_layer)
    return [x for x in found if lora.is_lora_layer(x)]


def leaves(out: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]


# Every family runs in the full suite; these in the fast loop (decoders, an encoder, convolutions).
FAST = {"GPT2LMHeadModel", "LlamaForCausalLM", "BertForSequenceClassification",
        "ResNetForImageClassification"}  # fmt: skip
ARCHS = [a if a in FAST else pytest.param(a, marks=pytest.mark.slow) for a in CASES]


def output_and_grads(arch: str) -> Callable[..., Any]:
    """`(adapters, frozen, key) -> ((loss, output leaves), the adapters' gradients)` of a
    squared-output loss: the output is its forward pass's, one compiled program for every key."""
    _, inputs = CASES[arch]

    def loss(adapters: Any, frozen: Any, key: Any) -> tuple[Any, list[Any]]:
        out = jax.tree_util.tree_leaves(tm.combine(adapters, frozen)(**inputs, key=key))
        return sum(jnp.sum(jnp.square(x)) for x in out), out

    return tm.filter_jit(tm.filter_value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_dropout_one_gives_the_base_output_and_keys_decide_the_rest(arch: str) -> None:
    key = jax.random.key(7)
    want, dropped = map(leaves, base_and_dropped(arch)(base(arch), tuned(arch, 1.0), key))
    # p = 1: every adapter's input is zero, so B @ A adds nothing, whatever B is.
    for got, ref in zip(dropped, want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    half = tuned(arch, 0.5)
    call = output_and_grads(arch)
    adapters, frozen = tm.partition(half, lora.trainable(half, []))  # no head trained whole
    (_, first), grads = call(adapters, frozen, key)
    (_, again), _ = call(adapters, frozen, key)
    (_, other), _ = call(adapters, frozen, jax.random.key(8))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(not np.allclose(a, b) for a, b in zip(first, other, strict=True))
    # The adapters matter at p = 0.5 (B is random), so the p = 1 check above tested them.
    assert any(not np.allclose(a, b) for a, b in zip(first, want, strict=True))
    # Training reaches every A through the dropped-out inputs.
    layers = lora_layers(grads)
    assert len(layers) == len(lora_layers(half)) > 0
    for layer in layers:
        g = np.asarray(layer.lora_A.weight)
        assert np.all(np.isfinite(g)), layer.path
        assert np.any(g != 0), layer.path


def test_a_training_call_without_a_key_names_the_layer_and_asks_for_one() -> None:
    model = tuned("LlamaForCausalLM", 0.1)
    with pytest.raises(
        ValueError,
        match=r"LoRALinear at model\.layers\.layers\.self_attn\.q_proj: lora_dropout=0\.1 "
        r"needs a key in training mode.*Pass `key=` to the model's call",
    ):
        model(input_ids=IDS)
    # In inference mode the adapters' dropout is off and no key is needed.
    np.testing.assert_array_equal(
        tm.nn.inference_mode(model)(input_ids=IDS),
        tm.nn.inference_mode(model)(input_ids=IDS, key=jax.random.key(0)),
    )


def test_a_few_optax_steps_with_lora_dropout_lower_a_llamas_loss() -> None:
    optax = pytest.importorskip("optax")
    model = lora.add_lora(
        base("LlamaForCausalLM"), ["q_proj", "v_proj", "down_proj"], r=4, alpha=8, dropout=0.05,
        key=jax.random.key(1),
    )  # fmt: skip
    adapters, frozen = tm.partition(model, lora.trainable(model))
    targets = jnp.roll(jnp.asarray(IDS), -1, axis=1)

    def loss(adapters: Any, key: Any) -> Any:
        logits = tm.combine(adapters, frozen)(input_ids=IDS, key=key)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)
        return -jnp.mean(picked)

    optimiser = optax.adam(1e-2)

    @tm.filter_jit
    def step(adapters: Any, state: Any, key: Any) -> tuple[Any, Any, Any]:
        value, grads = tm.filter_value_and_grad(loss)(adapters, key)
        updates, state = optimiser.update(grads, state, adapters)
        return tm.apply_updates(adapters, updates), state, value

    losses = []
    # optax's Adam mixes Python floats with int32 step counts, which strict promotion refuses.
    with jax.numpy_dtype_promotion("standard"):
        state = optimiser.init(tm.filter(adapters, tm.is_array))
        for key in jax.random.split(jax.random.key(2), 6):
            adapters, state, value = step(adapters, state, key)
            losses.append(float(value))
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.05, losses


# family: (transformers class, its config class, treemod class, config, PEFT target_modules,
# inputs, the output transformers returns)
PEFT_CASES: dict[str, tuple[str, str, str, dict[str, Any], list[str], dict[str, Any], str]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", "LlamaForCausalLM", DECODER,
              ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
              TEXT_IN, "logits"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", "GPT2LMHeadModel",
             {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64, "resid_pdrop": 0.0,
              "embd_pdrop": 0.0, "attn_pdrop": 0.0},
             ["c_attn", "c_proj", "c_fc"], TEXT_IN, "logits"),
    "bert": ("BertModel", "BertConfig", "BertModel",
             {**TEXT, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
             ["query", "key", "value", "dense"], TEXT_IN, "last_hidden_state"),
    "t5": ("T5ForConditionalGeneration", "T5Config", "T5ForConditionalGeneration",
           {**CASES["T5ForConditionalGeneration"][0], "dropout_rate": 0.0},
           ["q", "k", "v", "o", "wi", "wo"], CASES["T5ForConditionalGeneration"][1], "logits"),
}  # fmt: skip


@pytest.mark.slow
# peft 0.21 reads a property that transformers 5 deprecates; neither is ours.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("family", list(PEFT_CASES))
def test_dropout_one_in_training_mode_matches_peft(family: str, tmp_path: Any) -> None:
    """PEFT in train mode with `lora_dropout=1.0` against treemod in training mode with the
    same adapters (PEFT's file loaded): the base model's output, in both. The base models'
    own dropouts are 0, so only the adapters' dropout is random."""
    peft = pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf_name, config_name, tm_name, config, targets, inputs, field = PEFT_CASES[family]
    torch.manual_seed(0)
    hf_config = getattr(transformers, config_name).from_dict(
        {**config, "attn_implementation": "eager"}
    )
    hf = getattr(transformers, hf_name)(hf_config).eval()
    cls = tmm.registered_architectures()[tm_name]
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(0)))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for alias in model.tied_weights():
        state.pop(alias, None)
    model = tm.load_state_dict(model, state)
    torch_inputs = {k: torch.from_numpy(np.asarray(v, np.int64)) for k, v in inputs.items()}

    def hf_out(m: Any) -> np.ndarray:
        with torch.no_grad():
            return getattr(m(**torch_inputs), field).numpy()

    base_out = hf_out(hf)
    fan = {"fan_in_fan_out": True} if family == "gpt2" else {}
    config_ = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=1.0, **fan)
    reference = peft.get_peft_model(hf, config_)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    reference.save_pretrained(tmp_path)
    reference.train()
    want = hf_out(reference)
    reference.eval()
    adapted = hf_out(reference)
    # The adapters change the output (B is random), so equal outputs below test the dropout.
    assert np.max(np.abs(adapted - base_out)) > 1e-2 * np.max(np.abs(base_out))
    tuned = lora.load_adapter(model, tmp_path)
    got_eval = tm.filter_jit(lambda m: m(**inputs))(tuned)
    np.testing.assert_allclose(got_eval, adapted, rtol=1e-4, atol=1e-4)
    training = tm.nn.inference_mode(tuned, False)
    got = tm.filter_jit(lambda m, k: m(**inputs, key=k))(training, jax.random.key(3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(want, base_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "BertForSequenceClassification"])
def test_every_adapted_layer_draws_its_own_key(arch: str, monkeypatch: Any) -> None:
    """Each adapter call of one model call gets a key no other call gets (the layers of a
    `Stack` included): recorded from inside the compiled call."""
    seen: list[tuple[int, ...]] = []
    original = lora.LoRALinear.__call__

    def recording(self: Any, x: Any, *, key: Any = None) -> Any:
        record = lambda k: seen.append(tuple(np.asarray(k).ravel().tolist()))  # noqa: E731
        jax.debug.callback(record, jax.random.key_data(key))
        return original(self, x, key=key)

    model = tuned(arch, 0.5)
    monkeypatch.setattr(lora.LoRALinear, "__call__", recording)
    _, inputs = CASES[arch]
    jax.block_until_ready(tm.filter_jit(lambda m, k: m(**inputs, key=k))(model, jax.random.key(0)))
    layers = lora_layers(model)
    calls = sum(int(x.lora_A.weight.shape[0]) if x.lora_A.weight.ndim == 3 else 1 for x in layers)
    assert len(seen) == calls > 0
    assert len(set(seen)) == len(seen)


@pytest.mark.slow
def test_torchvisions_resnet_passes_keys_to_its_convolutions() -> None:
    from treemod.models.resnet_torchvision import resnet18

    model = resnet18(num_classes=3, key=jax.random.key(0))
    targets = wrappable(model)
    assert len(targets) == 21  # 20 convolutions (downsampling ones included) and fc

    def adapted(p: float) -> Any:
        new = lora.add_lora(model, targets, r=4, alpha=8, dropout=p, key=jax.random.key(1))
        return lora_training(randomise_b(new))

    call = tm.filter_jit(lambda m, k: m(PIXELS, key=k))
    key = jax.random.key(7)
    np.testing.assert_allclose(call(adapted(1.0), key), call(model, key), rtol=1e-5, atol=1e-5)
    half = adapted(0.5)
    np.testing.assert_array_equal(call(half, key), call(half, key))
    assert not np.allclose(call(half, key), call(half, jax.random.key(8)))
