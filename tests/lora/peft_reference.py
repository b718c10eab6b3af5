"""Shared setup for the LoRA tests: a tiny `transformers` model and its treemod twin with equal
weights, and PEFT's adapters with random non-zero B."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import peft
import torch
import transformers
from lora_arrays import randomise_b as randomise_b  # the tests import it from here

import treemod as tm
from treemod.models.gpt2 import GPT2LMHeadModel
from treemod.models.llama import LlamaForCausalLM

LLAMA = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
GPT2 = {"vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16}
FAMILIES = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig, LlamaForCausalLM, LLAMA),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, GPT2LMHeadModel, GPT2),
}


def pair(family: str) -> tuple[Any, Any]:
    """`(hf_model, treemod_model)` with equal random weights (float32, eval mode)."""
    hf_cls, config_cls, tm_cls, config = FAMILIES[family]
    torch.manual_seed(0)
    hf = hf_cls(config_cls.from_dict({**config, "attn_implementation": "eager"})).eval()
    model = tm.filter_eval_shape(lambda: tm_cls.from_config(config, key=jax.random.key(0)))
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    for alias in model.tied_weights():
        state.pop(alias)
    return hf, tm.load_state_dict(model, state)


def randomise_peft_b(peft_model: Any, seed: int = 1) -> None:
    """PEFT's B matrices start at zero; give them random values so that adapters matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))


def hf_logits(model: Any, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids)).logits.numpy()


def relative_error(got: Any, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def peft_model(hf: Any, target_modules: Any, r: int, alpha: float, **kw: Any) -> Any:
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=target_modules, **kw)
    return peft.get_peft_model(hf, config).eval()


IDS = np.array([[1, 5, 9, 3, 7, 2], [4, 4, 8, 10, 11, 0]], dtype=np.int64)
