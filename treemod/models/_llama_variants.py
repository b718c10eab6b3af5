"""Mistral and Qwen2: the Llama implementation read with their configs' defaults and rules.

Mistral has no biases and a sliding window (`sliding_window`, default 4096) on every layer;
Qwen2 has biases on q, k and v, and sliding windows on the layers its `layer_types` name (by
default, with `use_sliding_window`, the layers from `max_window_layers` on). The config reading
is `_llama._values`, keyed by each class's `model_type`.
"""

from __future__ import annotations

from typing import ClassVar

from treemod.models._base import register_architecture
from treemod.models._llama import LlamaForCausalLM, LlamaModel

__all__ = ["MistralForCausalLM", "MistralModel", "Qwen2ForCausalLM", "Qwen2Model"]


class MistralModel(LlamaModel):
    """Mistral's decoder (`LlamaModel` with Mistral's config: no biases, a sliding window)."""

    architecture: ClassVar[str] = "MistralModel"
    model_type: ClassVar[str] = "mistral"


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "MistralForCausalLM"
    model_type: ClassVar[str] = "mistral"
    body: ClassVar[type[LlamaModel]] = MistralModel


class Qwen2Model(LlamaModel):
    """Qwen2's decoder (q, k, v biases; sliding windows on the layers `layer_types` names)."""

    architecture: ClassVar[str] = "Qwen2Model"
    model_type: ClassVar[str] = "qwen2"


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 with its language-modelling head (see `LlamaForCausalLM`)."""

    architecture: ClassVar[str] = "Qwen2ForCausalLM"
    model_type: ClassVar[str] = "qwen2"
    body: ClassVar[type[LlamaModel]] = Qwen2Model


for _cls in (MistralModel, MistralForCausalLM, Qwen2Model, Qwen2ForCausalLM):
    register_architecture(_cls)
