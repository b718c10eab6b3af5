"""Checks the decoder families built on Llama share (Qwen3, Gemma 1-3, Phi-3, Mixtral).

Each takes a `transformers` model and treemod's twin (`lm_reference.pair`): a padded batch
against `transformers` on the real tokens, both ways through Hugging Face directories
(`from_pretrained` of `transformers`' files, `save_pretrained` read back by `transformers` with
no missing, unexpected or mismatched keys and equal tensors), and LoRA adapters against PEFT's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import peft
import torch
from lm_reference import RTOL, hf_output, padded_batch, relative_error, run

import treemod as tm
from treemod import lora
from treemod.models import from_pretrained, save_pretrained


def pair_through_files(
    hf_cls: Any, config_cls: Any, config: dict[str, Any], directory: Path, attn: str = "eager"
) -> tuple[Any, Any]:
    """`(hf_model, tm_model)`: `lm_reference.pair`'s random model, moved to treemod through
    `save_pretrained` and `from_pretrained` (for layouts whose files differ from the modules,
    as Mixtral's per-expert tensors)."""
    torch.manual_seed(0)
    hf = hf_cls(config_cls.from_dict({**config, "attn_implementation": attn})).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(directory)
    return hf, from_pretrained(directory)


def check_padded_batch(hf: Any, model: Any, vocab: int, seq: int = 7) -> None:
    """Left-padded batch: treemod's outputs equal `transformers`' on every position."""
    ids, mask = padded_batch(vocab, seq=seq)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    assert relative_error(run(model, {"input_ids": ids, "attention_mask": mask}), want) <= RTOL


def check_directories(hf: Any, tmp_path: Path, vocab: int) -> None:
    """`transformers`' saved directory loads into the class its config names, and back."""
    ids, mask = padded_batch(vocab)
    want = hf_output(hf, input_ids=ids, attention_mask=mask)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == type(hf).__name__
    # transformers' default (SDPA) attention: padded positions differ by implementation.
    got = run(model, {"input_ids": ids, "attention_mask": mask})
    assert relative_error(got, want, keep=mask) <= RTOL
    save_pretrained(model, tmp_path / "tm")
    back, info = type(hf).from_pretrained(tmp_path / "tm", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    back.eval()
    for key, value in hf.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    assert relative_error(hf_output(back, input_ids=ids, attention_mask=mask), want, mask) <= RTOL
    assert (back.config.model_type, back.config.architectures) == (
        hf.config.model_type,
        hf.config.architectures,
    )


def check_lora(hf: Any, model: Any, targets: list[str], tmp_path: Path, vocab: int) -> None:
    """treemod's adapters (random B) saved and loaded by PEFT give PEFT's outputs."""
    tuned = lora.add_lora(model, targets, r=4, alpha=8, key=jax.random.key(3))
    state = {k: np.asarray(v) for k, v in tm.state_dict(tuned).items()}
    rng = np.random.default_rng(4)
    for name in [k for k in state if "lora_B" in k]:
        state[name] = rng.normal(size=state[name].shape).astype(np.float32)
    tuned = tm.load_state_dict(tuned, state)
    lora.save_adapter(tuned, tmp_path / "adapter")
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    ids, mask = padded_batch(vocab)
    want = hf_output(reference, input_ids=ids, attention_mask=mask)
    got = run(tuned, {"input_ids": ids, "attention_mask": mask})
    assert relative_error(got, want) <= RTOL
    assert relative_error(run(model, {"input_ids": ids, "attention_mask": mask}), want) > 1e-3


# PEFT 0.21 calls transformers' deprecated `is_gradient_checkpointing` when it wraps a model.
PEFT_WARNING = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"


def check_bfloat16(cls: Any, config: dict[str, Any]) -> None:
    """`cls` builds in bfloat16 and its compiled forward gives finite bfloat16 outputs."""
    import jax.numpy as jnp

    model = cls.from_config(config, key=jax.random.key(0), dtype=jnp.bfloat16)
    out = run(model, {"input_ids": np.array([[1, 2, 3, 4, 5]])})
    assert out.dtype == jnp.bfloat16 and bool(jnp.isfinite(out).all())


def refused(cls: Any, config: dict[str, Any], key: str) -> None:
    """`cls.from_config(config)` refuses `key`, naming the class and the key."""
    import pytest

    with pytest.raises(tm.CheckpointError) as info:
        cls.from_config(config, key=jax.random.key(0))
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}: config value {key}="), message
    assert "not supported" in message


__all__ = [
    "PEFT_WARNING",
    "check_bfloat16",
    "pair_through_files",
    "check_directories",
    "check_lora",
    "check_padded_batch",
    "refused",
]
