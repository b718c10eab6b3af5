# exports: LlamaModel, LlamaForCausalLM
"""Llama: `LlamaModel`, `LlamaForCausalLM` and their layers (implemented in `_llama.py` and
`_llama_layers.py`; Mistral and Qwen2 are in `llama_variants`).

Attribute paths are `transformers`' parameter names (`model.layers.{i}.self_attn.q_proj.weight`).
"""

from treemod.models._llama import DEFAULTS, IGNORED_KEYS, LlamaForCausalLM, LlamaModel
from treemod.models._llama_layers import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from treemod.models._rope import Rope

__all__ = [
    "DEFAULTS",
    "IGNORED_KEYS",
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "LlamaMLP",
    "LlamaModel",
    "Rope",
]
