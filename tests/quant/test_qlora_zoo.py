"""QLoRA across the zoo against PyTorch: a small random `transformers` model per family,
quantised from the same float checkpoint by treemod (`quantise`) and by transformers +
bitsandbytes (CPU), the layers transformers picks; adapters trained in treemod (a few Adam
steps, gradients to the adapters only), saved by `save_adapter` and loaded by PEFT over the
bitsandbytes model; outputs and the adapters' gradients must agree. Also: treemod's quantised
checkpoints (`save_pretrained`) load into transformers' bitsandbytes layers byte for byte.

Both sides compute alike: bitsandbytes' CPU layers (in training mode, below) dequantise to
float32 and run one float32 matmul, as treemod's layers do, so only float32 summation orders
differ (measured: logits within 3e-7 of their largest value, gradients within 2e-4).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn
import treemod.quant as quant
from treemod.models import from_pretrained, save_pretrained

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
bnb = pytest.importorskip("bitsandbytes")
optax = pytest.importorskip("optax")
sys.path.insert(0, str(Path(__file__).parents[1] / "lora"))
from lora_arrays import randomise_b  # noqa: E402

# Every layer's input size is a multiple of 64, transformers' NF4 block size: bitsandbytes'
# CPU NF4 dequantisation kernel (0.50) is wrong for rows shorter than a block (last test).
TEXT = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64}  # fmt: skip
DECODER = {**TEXT, "num_key_value_heads": 2}
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IDS = np.array([[1, 5, 9, 3, 7, 2], [4, 4, 8, 10, 11, 13]], dtype=np.int64)

# family: (transformers class, config, PEFT-style target_modules of every linear layer)
FAMILIES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "llama": ("LlamaForCausalLM", DECODER, LLAMA_TARGETS),
    "qwen2": ("Qwen2ForCausalLM", DECODER, LLAMA_TARGETS),  # biased q, k, v
    "mistral": ("MistralForCausalLM", DECODER, LLAMA_TARGETS),
    "gemma": ("GemmaForCausalLM", {**DECODER, "head_dim": 16}, LLAMA_TARGETS),
    # Fused projections: one quantised layer (and one adapter) for q, k, v and for gate, up.
    "phi3": (
        "Phi3ForCausalLM",
        {**DECODER, "pad_token_id": 0},
        ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    ),  # fmt: skip
    # transformers' Conv1D (weights stored (in, out)); bitsandbytes quantises the transpose.
    "gpt2": (
        "GPT2LMHeadModel",
        {"vocab_size": 64, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 16},
        ["c_attn", "c_proj", "c_fc"],
    ),  # fmt: skip
    # An encoder: "dense" is also the pooler's. Its classifier head is trained whole (PEFT's
    # SEQ_CLS modules_to_save), so it stays float (`HEADS`).
    "bert": (
        "BertForSequenceClassification",
        {**TEXT, "num_labels": 3},
        ["query", "key", "value", "dense"],
    ),  # fmt: skip
    # Encoder-decoder: transformers keeps T5's `wo` in float32 (unquantised), LoRA wraps it.
    "t5": (
        "T5ForConditionalGeneration",
        {
            "vocab_size": 64,
            "d_model": 64,
            "d_kv": 16,
            "d_ff": 128,
            "num_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 12,
            "decoder_start_token_id": 0,
        },
        ["q", "k", "v", "o", "wi", "wo"],
    ),  # fmt: skip
}
SCHEMES: dict[str, dict[str, Any]] = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=False),
    "nf4-double": dict(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True
    ),
    "int8": dict(load_in_8bit=True),
}
# NF4 cases run PEFT over transformers' own quantisation of the float checkpoint (bit-identical
# to treemod's, asserted); the others over treemod's `save_pretrained` output.
CASES = [("llama", "nf4"), ("qwen2", "nf4-double"), ("mistral", "nf4"), ("gemma", "nf4"),
         ("phi3", "nf4"), ("gpt2", "nf4"), ("gpt2", "int8"), ("bert", "nf4"), ("bert", "int8"),
         ("t5", "nf4")]  # fmt: skip
QUANTISED = ("Linear4bit", "Linear8bitLt")
# Heads trained whole stay float: transformers would quantise them, which PEFT cannot train.
HEADS = {"bert": ["classifier"]}


def _inputs(family: str) -> dict[str, np.ndarray]:
    if family == "t5":
        return {"input_ids": IDS, "decoder_input_ids": IDS[:, :4]}
    return {"input_ids": IDS}


def _loss(logits: Any, xp: Any) -> Any:
    """The same scalar on both sides: the mean log-probability of class 0."""
    log_softmax = jax.nn.log_softmax if xp is jnp else (lambda x: torch.log_softmax(x, -1))
    return log_softmax(logits)[..., 0].mean()


def _torch_model(family: str, directory: Path, scheme: str | None = None) -> Any:
    cls = getattr(transformers, FAMILIES[family][0])
    options = {**SCHEMES[scheme], "llm_int8_skip_modules": HEADS.get(family)} if scheme else None
    config = transformers.BitsAndBytesConfig(**options) if options else None
    return cls.from_pretrained(
        directory, quantization_config=config, dtype=torch.float32, device_map="cpu"
    )


def _quantised_modules(model: Any) -> dict[str, Any]:
    return {n: m for n, m in model.named_modules() if type(m).__name__ in QUANTISED}


def _quantised_tensors(model: Any) -> dict[str, Any]:
    names = _quantised_modules(model)
    state = model.state_dict()
    return {k: v for k, v in state.items() if k.rsplit(".weight", 1)[0] in names or (
        k.endswith(".SCB") and k[: -len(".SCB")] in names)}  # fmt: skip


def _dequantised(module: Any) -> np.ndarray:
    """bitsandbytes' own dequantisation of a transformers `Linear4bit` / `Linear8bitLt`."""
    w = module.weight
    if hasattr(w, "quant_state"):
        return bnb.functional.dequantize_4bit(w.data, w.quant_state).float().numpy()
    return bnb.functional.int8_vectorwise_dequant(w.data, w.SCB).float().numpy()


def _float_checkpoint(family: str, directory: Path) -> None:
    cls_name, config, _ = FAMILIES[family]
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    config_cls = cls.config_class
    cls(config_cls.from_dict({**config, "attn_implementation": "eager"})).save_pretrained(directory)


def _train(tuned: Any, inputs: dict[str, Any], steps: int) -> tuple[Any, Any, Any]:
    """`steps` Adam steps on the adapters; the trained model, its logits and adapter gradients
    (one compiled step: its last call's outputs are those of the trained adapters)."""
    adapters, frozen = tm.partition(tuned, lora.trainable(tuned))
    optimiser = optax.adam(0.05)

    @tm.filter_jit
    def step(adapters: Any, opt_state: Any) -> Any:
        def loss(adapters: Any) -> Any:
            logits = tm.combine(adapters, frozen)(**inputs)
            return _loss(logits, jnp), logits

        (_, logits), grads = tm.filter_value_and_grad(loss, has_aux=True)(adapters)
        # optax's bias correction mixes a Python float with its int32 step count.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimiser.update(grads, opt_state)
        return logits, grads, tm.apply_updates(adapters, updates), opt_state

    opt_state = optimiser.init(tm.filter(adapters, tm.is_array))
    for _ in range(steps):
        _, _, adapters, opt_state = step(adapters, opt_state)
    logits, grads, _, _ = step(adapters, opt_state)
    return tm.combine(adapters, frozen), logits, grads


def _quantised_pair(family: str, scheme: str, directory: Path) -> tuple[Any, list[str], Any]:
    """transformers + bitsandbytes quantise a float checkpoint; treemod quantises the same
    layers the same way. Returns `(torch_model, names, treemod_model)`."""
    _float_checkpoint(family, directory)
    reference = _torch_model(family, directory, scheme)
    names = sorted(_quantised_modules(reference))
    kind: Any = "int8" if scheme == "int8" else "nf4"
    model = from_pretrained(directory)
    base = quant.quantise(model, names, kind, double_quant=scheme == "nf4-double")
    return reference, names, base


def _assert_bnb_equal(base: Any, reference: Any) -> None:
    """treemod's NF4 arrays are bitsandbytes' quantiser's, bit for bit."""
    ours = {k: np.asarray(v) for k, v in tm.state_dict(base).items()}
    theirs = {k: v.numpy() for k, v in reference.state_dict().items()}
    for name in _quantised_modules(reference):
        assert np.array_equal(ours[f"{name}.weight"], theirs[f"{name}.weight"].ravel()), name
        assert np.array_equal(ours[f"{name}.absmax"], theirs[f"{name}.weight.absmax"]), name


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(("family", "scheme"), CASES)
def test_qlora_trains_in_treemod_and_loads_into_peft_over_bitsandbytes(
    family: str, scheme: str, tmp_path: Path
) -> None:
    reference, names, base = _quantised_pair(family, scheme, tmp_path / "float")
    if scheme == "nf4":
        _assert_bnb_equal(base, reference)
        torch_base = reference
    else:
        # Double quantisation's offset is a float32 mean (another summation order; the packed
        # levels still agree) and bitsandbytes' int8 path rounds weights to float16 first,
        # which moves a few levels by one: PEFT runs over treemod's own checkpoint.
        save_pretrained(base, tmp_path / "quantised")
        torch_base = _torch_model(family, tmp_path / "quantised")
        assert sorted(_quantised_modules(torch_base)) == names
        for name, module in _quantised_modules(reference).items():
            ours = _quantised_modules(torch_base)[name]
            if scheme == "nf4-double":  # the NF4 levels themselves are bitsandbytes'
                assert torch.equal(ours.weight.data, module.weight.data), name
            want = _dequantised(module)
            got = _dequantised(ours)
            # One level of the row's (NF4: block's) scale, plus float16's rounding of it.
            step = np.abs(want).max(axis=1, keepdims=True) / 127
            assert np.all(np.abs(got - want) <= step + 2**-10 * np.abs(want)), name

    # `dequantise` gives bitsandbytes' dequantised weights bit for bit, GPT-2's back in
    # Conv1D's (in, out) layout (so the float model saves as GPT-2 checkpoints store it).
    back = tm.state_dict(quant.dequantise(base))
    for name, module in _quantised_modules(torch_base).items():
        weight = np.asarray(back[f"{name}.weight"])
        want = _dequantised(module)
        assert np.array_equal(weight.T if family == "gpt2" else weight, want), name

    targets = FAMILIES[family][2]
    tuned = lora.add_lora(base, targets, r=4, alpha=8, key=jax.random.key(3))
    inputs = _inputs(family)
    trained, logits, grads = _train(tuned, inputs, steps=3)
    # Gradients reach the adapters only (float32 A and B, none of the packed base; and a
    # classifier head, trained whole), and training leaves the rest as it was, bit for bit.
    assert {x.dtype for x in jax.tree_util.tree_leaves(grads)} == {jnp.dtype("float32")}
    frozen = tm.filter(trained, lora.trainable(trained), inverse=True)
    assert tm.tree_equal(tm.filter(tuned, lora.trainable(tuned), inverse=True), frozen)
    zeros = jax.tree_util.tree_map(lambda x: jnp.zeros_like(x) if tm.is_array(x) else x, frozen)
    named_grads = tm.state_dict(tm.combine(grads, zeros))
    adapter_grads = {k: v for k, v in named_grads.items() if ".lora_" in k}
    adapted = {k.removesuffix(".lora_A.weight") for k in adapter_grads if "lora_A" in k}
    # Every quantised layer the targets name carries an adapter.
    assert {n for n in names if n.rsplit(".", 1)[-1] in targets} <= adapted
    assert len(adapter_grads) == 2 * len(adapted) and all(
        np.any(np.asarray(g) != 0) for g in adapter_grads.values())  # fmt: skip

    lora.save_adapter(trained, tmp_path / "adapter")
    reference_peft = peft.PeftModel.from_pretrained(torch_base, str(tmp_path / "adapter"),
                                                    is_trainable=True).eval()  # fmt: skip
    # bitsandbytes' CPU layers in training mode dequantise to float32 and run one float32
    # matmul (in inference its int8 layer quantises the inputs too); the rest stays in eval.
    for module in _quantised_modules(reference_peft).values():
        module.train()
    out = reference_peft(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits
    _loss(out, torch).backward()
    want = out.detach().numpy()
    got = np.asarray(logits)
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want)), family
    # The adapters' (and a head's) gradients equal PyTorch's through PEFT over bitsandbytes.
    compared = set()
    for name, p in reference_peft.named_parameters():
        if p.requires_grad:
            key = name.removeprefix("base_model.model.").replace(".default", "")
            key = key.replace(".modules_to_save", "")
            np.testing.assert_allclose(named_grads[key], p.grad.numpy(), rtol=1e-4,
                                       atol=1e-6, err_msg=key)  # fmt: skip
            compared.add(key)
    assert set(adapter_grads) <= compared
    assert len(compared - set(adapter_grads)) == 2 * len(HEADS.get(family, []))  # weight, bias


# T5's lm_head is tied to its embedding (no Linear in treemod): save_pretrained lists it in
# llm_int8_skip_modules, which replaces transformers' default skips.
@pytest.mark.parametrize("family", list(FAMILIES))
def test_quantised_zoo_models_save_what_transformers_loads(family: str, tmp_path: Path) -> None:
    reference, names, base = _quantised_pair(family, "nf4", tmp_path / "float")
    save_pretrained(base, tmp_path / "quantised")
    loaded = _torch_model(family, tmp_path / "quantised")
    # The same layers quantised, holding bitsandbytes' own quantisation's bytes.
    assert sorted(_quantised_modules(loaded)) == names
    ours, theirs = _quantised_tensors(loaded), _quantised_tensors(reference)
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert torch.equal(ours[name].view(torch.uint8), value.view(torch.uint8)), name
    # Every other tensor is the float checkpoint's.
    state, want = loaded.state_dict(), reference.state_dict()
    for name in set(want) - set(theirs):
        assert torch.equal(state[name], want[name]), name


def test_nf4_rows_shorter_than_a_block_dequantise_as_bitsandbytes_blocks() -> None:
    """NF4 blocks run over the flattened weight, across rows; bitsandbytes' CPU kernel
    dequantises blocks row by row, wrong for rows shorter than a block. The same packed bytes
    viewed as 64-wide rows go through its kernel correctly: treemod's layer must equal that."""
    layer = nn.Linear(32, 48, key=jax.random.key(0))
    q = quant.quantise(nn.Sequential([layer]), ["0"], "nf4", double_quant=False).layers[0]
    w = torch.from_numpy(np.array(layer.weight))
    packed, state = bnb.functional.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert np.array_equal(packed.numpy().ravel(), np.asarray(q.weight))
    state.shape = torch.Size([48 * 32 // 64, 64])
    want = bnb.functional.dequantize_4bit(packed, state).numpy().reshape(48, 32)
    assert np.array_equal(np.asarray(q.dequantised_weight()), want)


# transformers quantises GPT-2's Conv1D layers (transposed); from_pretrained reads them so.
@pytest.mark.parametrize("scheme", ["nf4", "int8"])
def test_transformers_quantised_gpt2_checkpoints_load(scheme: str, tmp_path: Path) -> None:
    _float_checkpoint("gpt2", tmp_path / "float")
    reference = _torch_model("gpt2", tmp_path / "float", scheme)
    reference.save_pretrained(tmp_path / "quantised")
    model = from_pretrained(tmp_path / "quantised")
    back = tm.state_dict(quant.dequantise(model))
    for name, module in _quantised_modules(reference).items():
        assert np.array_equal(np.asarray(back[f"{name}.weight"]).T, _dequantised(module)), name
    for module in _quantised_modules(reference).values():
        module.train()  # float32 dequantise-then-matmul, as in the QLoRA test
    with torch.no_grad():
        want = reference(input_ids=torch.from_numpy(IDS)).logits.numpy()
    got = np.asarray(model(input_ids=IDS))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


def is_stack(x: Any) -> bool:
    return isinstance(x, nn.Stack)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_remat_gives_the_same_qlora_gradients(family: str, tmp_path: Path) -> None:
    """`from_pretrained(..., remat=True)` keeps rematerialising after `quantise` and `add_lora`
    (the rewrites restack the layers), with the gradients of the model without it."""
    _float_checkpoint(family, tmp_path)
    targets = FAMILIES[family][2]
    grads, checkpoints = [], []
    for remat in (False, True):
        base = quant.quantise(from_pretrained(tmp_path, remat=remat), targets, "nf4")
        # Random B (it starts at zero), so that A gets a gradient too.
        tuned = randomise_b(lora.add_lora(base, targets, r=4, alpha=8, key=jax.random.key(1)))
        adapters, frozen = tm.partition(tuned, lora.trainable(tuned))

        def loss(adapters: Any, frozen: Any = frozen) -> Any:
            return _loss(tm.combine(adapters, frozen)(input_ids=IDS), jnp)

        stacks = [x for x in jax.tree_util.tree_leaves(tuned, is_leaf=is_stack) if is_stack(x)]
        assert stacks and all(s.remat is remat for s in stacks)
        grads.append(tm.filter_jit(tm.filter_grad(loss))(adapters))
        jaxpr = str(tm.filter_make_jaxpr(tm.filter_grad(loss))(adapters)[0])
        # jax.checkpoint's primitive: `remat2` in the printed jaxpr (`checkpoint` in some JAXes)
        checkpoints.append(jaxpr.count("remat") + jaxpr.count("checkpoint["))
    # The quantised layers checkpoint their slices either way; remat adds the layers'.
    assert checkpoints[1] > checkpoints[0]
    # Recomputing runs the same float32 operations, which XLA may fuse otherwise.
    for a, b in zip(*(jax.tree_util.tree_leaves(g) for g in grads), strict=True):
        scale = float(jnp.max(jnp.abs(a)))
        assert scale > 0 and float(jnp.max(jnp.abs(a - b))) <= 1e-5 * scale


def test_gpt2_qlora_dequantised_and_merged_saves_as_gpt2(tmp_path: Path) -> None:
    """After QLoRA, `dequantise` then `merge` gives a float GPT-2 (Conv1D layers again, the
    update folded in with PEFT's `fan_in_fan_out`) that transformers loads and runs as treemod
    ran the adapted quantised model."""
    _float_checkpoint("gpt2", tmp_path / "float")
    targets = FAMILIES["gpt2"][2]
    base = quant.quantise(from_pretrained(tmp_path / "float"), targets, "nf4")
    tuned = randomise_b(lora.add_lora(base, targets, r=4, alpha=8, key=jax.random.key(2)))
    merged = lora.merge(quant.dequantise(tuned))
    save_pretrained(merged, tmp_path / "merged")
    reference = _torch_model("gpt2", tmp_path / "merged")
    assert not _quantised_modules(reference)
    with torch.no_grad():
        want = reference(input_ids=torch.from_numpy(IDS)).logits.numpy()
    got = np.asarray(tm.filter_jit(lambda m: m(input_ids=IDS))(tuned))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
