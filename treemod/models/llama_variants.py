# exports: MistralModel, MistralForCausalLM, Qwen2Model, Qwen2ForCausalLM
"""Mistral and Qwen2: the Llama implementation read with their configs' rules (implemented in
`_llama_variants.py`)."""

from treemod.models._llama_variants import (
    MistralForCausalLM,
    MistralModel,
    Qwen2ForCausalLM,
    Qwen2Model,
)

__all__ = ["MistralForCausalLM", "MistralModel", "Qwen2ForCausalLM", "Qwen2Model"]
