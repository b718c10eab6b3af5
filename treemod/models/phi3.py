# exports: Phi3Model, Phi3ForCausalLM
"""Phi-3: `Phi3Model`, `Phi3ForCausalLM` and their fused layers (implemented in `_phi3.py` on
the Llama implementation). Attribute paths are `transformers`' parameter names
(`model.layers.{i}.self_attn.qkv_proj.weight`)."""

from treemod.models._phi3 import Phi3Attention, Phi3ForCausalLM, Phi3MLP, Phi3Model

__all__ = ["Phi3Attention", "Phi3ForCausalLM", "Phi3MLP", "Phi3Model"]
