# exports: GPT2Model, GPT2LMHeadModel
"""GPT-2: `GPT2Model`, `GPT2LMHeadModel` and their parts (implemented in `_gpt2.py`).

Attribute paths are `transformers`' parameter names (`transformer.h.{i}.attn.c_attn.weight`);
`Conv1D` stores GPT-2's `(in, out)` projection weights as `transformers` does.
"""

from treemod.models._gpt2 import (
    GPT2_DEFAULTS,
    GPT2MLP,
    IGNORED_KEYS,
    Conv1D,
    GPT2Attention,
    GPT2Block,
    GPT2LMHeadModel,
    GPT2Model,
)

__all__ = [
    "GPT2_DEFAULTS",
    "IGNORED_KEYS",
    "Conv1D",
    "GPT2Attention",
    "GPT2Block",
    "GPT2LMHeadModel",
    "GPT2MLP",
    "GPT2Model",
]
