"""`treemod.models`: reference architectures built from Hugging Face configs, and their files.

`from_pretrained` loads a local Hugging Face directory (`config.json` plus safetensors weights)
into the zoo class its config names; `save_pretrained` writes one back that `transformers` loads.
Every zoo model subclasses `PretrainedModel` and is found through `register_architecture`.
"""

from treemod.models._base import (
    PretrainedConfig,
    PretrainedModel,
    config_error,
    register_architecture,
    registered_architectures,
)

__all__ = [
    "PretrainedConfig",
    "PretrainedModel",
    "config_error",
    "register_architecture",
    "registered_architectures",
]
