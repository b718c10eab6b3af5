"""Checks every BERT-like family's tests share (RoBERTa, XLM-R, DistilBERT, MPNet).

Reference: `transformers`' own classes, random-initialised from small configs, in `eval()` mode
with eager attention; float32 outputs agree within `RTOL` relative (max abs error over max abs
value). The checks: equal outputs on left- and right-padded batches, `save_pretrained` both
ways with equal tensors, the old `position_ids` buffer skipped as `transformers` skips it, and
LoRA adapters with PEFT's module names loading into PEFT.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import peft
import safetensors.numpy
import torch
from lm_reference import run

import treemod as tm
import treemod.lora as lora
from treemod.models import from_pretrained, save_pretrained

RTOL = 1e-5


def relative_error(got: Any, ref: Any) -> float:
    ref_np = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    return float(np.abs(np.asarray(got) - ref_np).max() / np.abs(ref_np).max())


def hf_model(hf_cls: Any, config_cls: Any, config: dict[str, Any], seed: int = 0) -> Any:
    torch.manual_seed(seed)
    return hf_cls(config_cls(**config, attn_implementation="eager")).eval()


def twin(cls: Any, hf: Any) -> Any:
    """The treemod model built from `hf`'s config and loaded from its tensors."""
    config = json.loads(hf.config.to_json_string())
    model = tm.filter_eval_shape(lambda: cls.from_config(config, key=jax.random.key(1)))
    tensors = dict(hf.state_dict())
    for alias, source in model.tied_weights().items():
        assert tensors[alias] is tensors[source] or torch.equal(tensors[alias], tensors[source])
        del tensors[alias]
    return tm.load_state_dict(model, tensors)


def reference(hf: Any, inputs: dict[str, np.ndarray]) -> torch.Tensor:
    with torch.inference_mode():
        out = hf(**{k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()})
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def padded(
    rng: np.random.Generator, batch: int, seq: int, vocab: int, pad: int | None, side: str
) -> dict[str, np.ndarray]:
    """Token ids (no padding id among the real ones) padded on `side` with `pad`, and the mask."""
    real = [v for v in range(vocab) if v != pad]
    ids = rng.choice(real, (batch, seq))
    mask = np.ones((batch, seq), np.int64)
    for b in range(batch):
        n = int(rng.integers(1, seq + 1))
        cut = slice(0, seq - n) if side == "left" else slice(n, seq)
        mask[b, cut] = 0
        if pad is not None:
            ids[b, cut] = pad
    return {"input_ids": ids, "attention_mask": mask}


def real_token_error(got: Any, ref: torch.Tensor, mask: np.ndarray) -> float:
    """The relative error over the real tokens only (a padded token's output is unspecified)."""
    keep = mask.astype(bool)
    return relative_error(np.asarray(got)[keep], ref.detach().numpy()[keep])


def check_padding(model: Any, hf: Any, config: dict[str, Any], pad: int | None) -> None:
    for side in ("left", "right"):
        inputs = padded(np.random.default_rng(3), 3, 7, config["vocab_size"], pad, side)
        ref, got = reference(hf, inputs), run(model, inputs)
        assert got.shape == tuple(ref.shape)
        if got.ndim == 3:
            assert real_token_error(got, ref, inputs["attention_mask"]) < RTOL, side
        else:
            assert relative_error(got, ref) < RTOL, side


def check_round_trip(cls: Any, hf_cls: Any, hf: Any, tmp_path: Path, inputs: dict) -> None:
    """transformers' directory into treemod and treemod's back: equal tensors and outputs."""
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model) is cls
    assert relative_error(run(model, inputs), reference(hf, inputs)) < RTOL
    save_pretrained(model, tmp_path / "ours")
    again, info = hf_cls.from_pretrained(
        tmp_path / "ours", output_loading_info=True, attn_implementation="eager"
    )
    assert not (info["missing_keys"] or info["unexpected_keys"] or info["mismatched_keys"])
    mine, theirs = again.state_dict(), hf.state_dict()
    assert set(mine) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(mine[name], tensor), name
    assert relative_error(run(model, inputs), reference(again.eval(), inputs)) < RTOL
    files = safetensors.numpy.load_file(tmp_path / "hf" / "model.safetensors")
    ours = safetensors.numpy.load_file(tmp_path / "ours" / "model.safetensors")
    assert set(files) == set(ours)  # the tied names written exactly as transformers writes them


def check_position_ids_skipped(cls: Any, hf_cls: Any, hf: Any, tmp_path: Path) -> None:
    """An old file's `embeddings.position_ids` loads in both libraries without a word; another
    unknown tensor is still refused."""
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    embeddings = next(k for k in tensors if "embeddings.word_embeddings" in k)
    buffer = embeddings.replace("word_embeddings.weight", "position_ids")
    limit = hf.config.max_position_embeddings
    tensors[buffer] = np.arange(limit, dtype=np.int64)[None]
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    _, info = hf_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"]
    assert type(from_pretrained(tmp_path)) is cls
    tensors[embeddings.replace("word_embeddings.weight", "something_else")] = np.zeros(1)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
    try:
        from_pretrained(tmp_path)
    except tm.CheckpointError as error:
        assert "something_else" in str(error)
    else:
        raise AssertionError("an unknown tensor loaded without an error")


def check_lora(model: Any, hf: Any, targets: list[str], inputs: dict, tmp_path: Path) -> None:
    """treemod's adapters with PEFT's names, saved and loaded by PEFT, give PEFT's outputs."""
    tuned = lora.add_lora(model, targets, r=4, alpha=8, key=jax.random.key(3))
    keys = iter(jax.random.split(jax.random.key(4), 100))

    def randomise(layer: Any) -> Any:
        w = layer.lora_B.weight
        return tm.tree_at(lambda m: m.lora_B.weight, layer, jax.random.normal(next(keys), w.shape))

    with tm.shape_checks(False):  # a Stack's LoRA layer holds stacked arrays
        tuned = jax.tree_util.tree_map(
            lambda x: randomise(x) if lora.is_lora_layer(x) else x,
            tuned,
            is_leaf=lora.is_lora_layer,
        )
    lora.save_adapter(tuned, tmp_path)
    reference_model = peft.PeftModel.from_pretrained(hf, str(tmp_path)).eval()
    loaded = sum("lora_B" in n for n, _ in reference_model.named_parameters())
    assert loaded == sum(".lora_B." in n for n in tm.state_dict(tuned)) > 0
    want = reference(reference_model, inputs)
    assert relative_error(run(tuned, inputs), want) < RTOL
    assert relative_error(run(model, inputs), want) > 1e-3  # the adapters mattered


def check_dropout(model: Any, inputs: dict) -> None:
    """Dropout is off as built; after `inference_mode(model, False)` each key drops other units."""
    evaluation = run(model, inputs)
    assert bool(jax.numpy.array_equal(evaluation, run(model, {**inputs, "key": jax.random.key(1)})))
    training = tm.nn.inference_mode(model, False)
    a = run(training, {**inputs, "key": jax.random.key(1)})
    b = run(training, {**inputs, "key": jax.random.key(2)})
    assert not bool(jax.numpy.allclose(a, evaluation)) and not bool(jax.numpy.allclose(a, b))
