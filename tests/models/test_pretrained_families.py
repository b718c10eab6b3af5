"""Every zoo class through Hugging Face directories, both ways, against `transformers`.

For each class: `transformers`' randomly initialised model (tiny config) saved by its own
`save_pretrained` loads with treemod's `from_pretrained` into the class named by its config,
with the same output (1e-5 relative: max abs error over max abs value); treemod's
`save_pretrained` of that model loads in `transformers` with no missing, unexpected or
mismatched keys, equal tensors and the same output. GPT-2's many cases are in
test_pretrained_gpt2.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

import treemod as tm
from treemod.models import from_pretrained, save_pretrained

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

LM = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2}
LM_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
BERT = {
    "vocab_size": 50,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 16,
    "num_labels": 3,
}
VIT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "image_size": 32,
    "patch_size": 8,
    "num_labels": 3,
}
RESNET = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 2], "num_labels": 3}

# (transformers class, config class, config, inputs).
CASES: dict[str, tuple[Any, Any, dict[str, Any], str]] = {
    "LlamaModel": (transformers.LlamaModel, transformers.LlamaConfig, {**LM, **LM_HEADS}, "text"),
    "LlamaForCausalLM": (
        transformers.LlamaForCausalLM,
        transformers.LlamaConfig,
        {**LM, **LM_HEADS, "tie_word_embeddings": True},
        "text",
    ),
    "MistralForCausalLM": (
        transformers.MistralForCausalLM,
        transformers.MistralConfig,
        {**LM, **LM_HEADS},
        "text",
    ),
    "Qwen2ForCausalLM": (
        transformers.Qwen2ForCausalLM,
        transformers.Qwen2Config,
        {**LM, **LM_HEADS},
        "text",
    ),
    "BertModel": (transformers.BertModel, transformers.BertConfig, BERT, "bert"),
    "BertForMaskedLM": (transformers.BertForMaskedLM, transformers.BertConfig, BERT, "bert"),
    "BertForSequenceClassification": (
        transformers.BertForSequenceClassification,
        transformers.BertConfig,
        BERT,
        "bert",
    ),
    "ViTModel": (transformers.ViTModel, transformers.ViTConfig, VIT, "image"),
    "ViTForImageClassification": (
        transformers.ViTForImageClassification,
        transformers.ViTConfig,
        VIT,
        "image",
    ),
    "ResNetModel": (transformers.ResNetModel, transformers.ResNetConfig, RESNET, "image"),
    "ResNetForImageClassification": (
        transformers.ResNetForImageClassification,
        transformers.ResNetConfig,
        RESNET,
        "image",
    ),
}


def _inputs(kind: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if kind == "image":
        return {"pixel_values": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}
    ids = rng.integers(0, 50, (2, 7))
    mask = np.ones((2, 7), np.int64)
    mask[1, 5:] = 0
    if kind == "bert":
        types = np.zeros((2, 7), np.int64)
        types[:, 4:] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {"input_ids": ids, "attention_mask": mask}


def _hf(name: str) -> Any:
    cls, config_cls, config, _ = CASES[name]
    torch.manual_seed(0)
    model = cls(config_cls(**config))
    with torch.no_grad():  # parameters and statistics away from their initial values
        for key, p in model.named_parameters():
            if "norm" in key.lower() or key.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-1, 1)
                module.running_var.uniform_(0.5, 2)
    return model.eval()


def _hf_out(model: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    value = out.logits if hasattr(out, "logits") else out.last_hidden_state
    return value.numpy()


def _close(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    error = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert error <= 1e-5, error


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_ways_through_directories(name: str, tmp_path: Path) -> None:
    hf = _hf(name)
    inputs = _inputs(CASES[name][3])
    want = _hf_out(hf, inputs)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == name
    run = tm.filter_jit(lambda m, x: m(**x))
    _close(run(model, inputs), want)

    save_pretrained(model, tmp_path / "tm")
    back, info = type(hf).from_pretrained(tmp_path / "tm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    back.eval()
    for key, value in hf.state_dict().items():
        if key.endswith("num_batches_tracked"):
            continue  # treemod's BatchNorm keeps no batch count (it writes 0)
        assert torch.equal(back.state_dict()[key], value), key
    _close(_hf_out(back, inputs), want)


# How real checkpoints differ from what transformers 5 writes. -----------------------------------


def _edit(directory: Path, rename: Any = None, add: Any = None, architecture: str = "") -> None:
    from safetensors.numpy import load_file, save_file

    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    if rename is not None:
        tensors = {rename(k): v for k, v in tensors.items()}
    tensors.update(add or {})
    save_file(tensors, str(file), {"format": "pt"})
    if architecture:
        config = json.loads((directory / "config.json").read_text())
        config["architectures"] = [architecture]
        (directory / "config.json").write_text(json.dumps(config))


def test_a_base_gpt2_file_with_mask_buffers_loads_into_the_lm_head_model(tmp_path: Path) -> None:
    """The Hub's `gpt2`: GPT2LMHeadModel in its config, the base model's names in its file
    (no `transformer.`), and the causal-mask buffers `h.N.attn.bias` of old versions."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16)
    transformers.GPT2Model(config).save_pretrained(tmp_path)
    buffers = {f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 16, 16), np.float32)) for i in range(2)}
    _edit(tmp_path, add=buffers, architecture="GPT2LMHeadModel")
    reference = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    inputs = _inputs("text")
    model = from_pretrained(tmp_path)
    _close(model(**inputs), _hf_out(reference, inputs))


def test_legacy_layernorm_names_load(tmp_path: Path) -> None:
    hf = _hf("BertModel")
    hf.save_pretrained(tmp_path)
    _edit(tmp_path, rename=lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma"))
    _edit(tmp_path, rename=lambda k: k.replace("LayerNorm.bias", "LayerNorm.beta"))
    inputs = _inputs("bert")
    _close(from_pretrained(tmp_path)(**inputs), _hf_out(hf, inputs))


def test_a_file_with_a_head_loads_into_the_base_model_reporting_the_head(tmp_path: Path) -> None:
    hf = _hf("BertForMaskedLM")
    hf.save_pretrained(tmp_path)
    _edit(tmp_path, architecture="BertModel")
    with pytest.raises(tm.CheckpointError, match=r"unexpected \(\d+\): cls\.predictions\.bias"):
        from_pretrained(tmp_path)
    model, report = from_pretrained(tmp_path, strict=False)
    assert report.unexpected and all(n.startswith("cls.") for n in report.unexpected)
    # BertForMaskedLM has no pooler: the base model's stays random, as in transformers.
    assert report.missing == ("pooler.dense.bias", "pooler.dense.weight")
    assert not report.mismatched
    inputs = _inputs("bert")
    _close(model(**inputs), _hf_out(hf.bert, inputs))


def test_architecture_chooses_another_class_than_the_config(tmp_path: Path) -> None:
    hf = _hf("BertForMaskedLM")
    hf.save_pretrained(tmp_path)
    inputs = _inputs("bert")
    model, report = from_pretrained(tmp_path, architecture="BertModel", strict=False)
    assert type(model).__name__ == "BertModel" and report.unexpected
    _close(model(**inputs), _hf_out(hf.bert, inputs))
    from treemod.models import BertModel

    again, _ = from_pretrained(tmp_path, architecture=BertModel, strict=False)
    _close(again(**inputs), _hf_out(hf.bert, inputs))
    with pytest.raises(tm.CheckpointError, match=r"architecture='BertForPreTraining'.*known: "):
        from_pretrained(tmp_path, architecture="BertForPreTraining")
    with pytest.raises(TypeError, match=r"architecture=Linear\): not a subclass"):
        from_pretrained(tmp_path, architecture=tm.nn.Linear)  # type: ignore[arg-type]
