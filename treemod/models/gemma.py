# exports: GemmaModel, GemmaForCausalLM, Gemma2Model, Gemma2ForCausalLM, Gemma3TextModel, Gemma3ForCausalLM  # noqa: E501
"""Gemma, Gemma 2 and Gemma 3 (text): the Llama implementation read with their configs' rules
(implemented in `_gemma.py`). Attribute paths are `transformers`' parameter names."""

from treemod.models._gemma import (
    Gemma2ForCausalLM,
    Gemma2Model,
    Gemma3ForCausalLM,
    Gemma3TextModel,
    GemmaForCausalLM,
    GemmaModel,
    GemmaRMSNorm,
)

__all__ = [
    "Gemma2ForCausalLM",
    "Gemma2Model",
    "Gemma3ForCausalLM",
    "Gemma3TextModel",
    "GemmaForCausalLM",
    "GemmaModel",
    "GemmaRMSNorm",
]
