# exports: MistralModel, MistralForCausalLM, Qwen2Model, Qwen2ForCausalLM, Qwen3Model, Qwen3ForCausalLM  # noqa: E501
"""Mistral, Qwen2 and Qwen3: the Llama implementation read with their configs' rules (implemented in
`_llama_variants.py`)."""

from treemod.models._llama_variants import (
    MistralForCausalLM,
    MistralModel,
    Qwen2ForCausalLM,
    Qwen2Model,
    Qwen3ForCausalLM,
    Qwen3Model,
)

__all__ = [
    "MistralForCausalLM",
    "MistralModel",
    "Qwen2ForCausalLM",
    "Qwen2Model",
    "Qwen3ForCausalLM",
    "Qwen3Model",
]
