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
from treemod.models._causal_lm import CausalLM
from treemod.models._generate import GenerateOutput, generate
from treemod.models._generate_text import generate_text
from treemod.models._pretrained_load import from_pretrained
from treemod.models._pretrained_save import save_pretrained
from treemod.models._tokenizer import Tokenizer

# The zoo (importing each module registers its architectures).
from treemod.models.bert import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from treemod.models.clip import (
    CLIPForImageClassification,
    CLIPModel,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
)
from treemod.models.convnext import (
    ConvNextForImageClassification,
    ConvNextModel,
)
from treemod.models.deberta_v2 import (
    DebertaV2ForMaskedLM,
    DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification,
    DebertaV2Model,
)
from treemod.models.dinov2 import (
    Dinov2ForImageClassification,
    Dinov2Model,
)
from treemod.models.distilbert import (
    DistilBertForMaskedLM,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
)
from treemod.models.gemma import (
    Gemma2ForCausalLM,
    Gemma2Model,
    Gemma3ForCausalLM,
    Gemma3TextModel,
    GemmaForCausalLM,
    GemmaModel,
)
from treemod.models.gpt2 import GPT2LMHeadModel, GPT2Model
from treemod.models.llama import LlamaForCausalLM, LlamaModel
from treemod.models.llama_variants import (
    MistralForCausalLM,
    MistralModel,
    Qwen2ForCausalLM,
    Qwen2Model,
    Qwen3ForCausalLM,
    Qwen3Model,
)
from treemod.models.mixtral import (
    MixtralForCausalLM,
    MixtralModel,
)
from treemod.models.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from treemod.models.mpnet import (
    MPNetForMaskedLM,
    MPNetForSequenceClassification,
    MPNetForTokenClassification,
    MPNetModel,
)
from treemod.models.phi3 import (
    Phi3ForCausalLM,
    Phi3Model,
)
from treemod.models.resnet import ResNetForImageClassification, ResNetModel
from treemod.models.resnet_torchvision import (
    TorchvisionResNet,
    resnet18,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
    resnext50_32x4d,
    resnext101_32x8d,
    resnext101_64x4d,
    wide_resnet50_2,
    wide_resnet101_2,
)
from treemod.models.roberta import (
    RobertaForMaskedLM,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
)
from treemod.models.siglip import (
    SiglipForImageClassification,
    SiglipModel,
    SiglipTextModel,
    SiglipVisionModel,
)
from treemod.models.t5 import (
    Seq2SeqLM,
    T5EncoderModel,
    T5ForConditionalGeneration,
    T5ForSequenceClassification,
    T5ForTokenClassification,
    T5Model,
    generate_seq2seq,
)
from treemod.models.vit import ViTForImageClassification, ViTModel
from treemod.models.wav2vec2 import (
    Wav2Vec2ForCTC,
    Wav2Vec2ForSequenceClassification,
    Wav2Vec2Model,
)
from treemod.models.whisper import (
    WhisperForAudioClassification,
    WhisperForConditionalGeneration,
    WhisperModel,
    log_mel_features,
)
from treemod.models.xlm_roberta import (
    XLMRobertaForMaskedLM,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)

__all__ = [
    # Loading and saving.
    "from_pretrained",
    "save_pretrained",
    "generate",
    "generate_seq2seq",
    "generate_text",
    "log_mel_features",
    "GenerateOutput",
    "Tokenizer",
    # Building blocks of the zoo.
    "CausalLM",
    "Seq2SeqLM",
    "PretrainedConfig",
    "PretrainedModel",
    "config_error",
    "register_architecture",
    "registered_architectures",
    # The zoo.
    "Gemma2ForCausalLM",
    "Gemma2Model",
    "Gemma3ForCausalLM",
    "Gemma3TextModel",
    "GemmaForCausalLM",
    "GemmaModel",
    "MixtralForCausalLM",
    "MixtralModel",
    "Phi3ForCausalLM",
    "Phi3Model",
    "Qwen3ForCausalLM",
    "Qwen3Model",
    "CLIPForImageClassification",
    "CLIPModel",
    "CLIPTextModel",
    "CLIPTextModelWithProjection",
    "CLIPVisionModel",
    "CLIPVisionModelWithProjection",
    "ConvNextForImageClassification",
    "ConvNextModel",
    "DebertaV2ForMaskedLM",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
    "DebertaV2Model",
    "Dinov2ForImageClassification",
    "Dinov2Model",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
    "SiglipForImageClassification",
    "SiglipModel",
    "SiglipTextModel",
    "SiglipVisionModel",
    "Wav2Vec2ForCTC",
    "Wav2Vec2ForSequenceClassification",
    "Wav2Vec2Model",
    "BertForTokenClassification",
    "DistilBertForMaskedLM",
    "DistilBertForSequenceClassification",
    "DistilBertForTokenClassification",
    "DistilBertModel",
    "MPNetForMaskedLM",
    "MPNetForSequenceClassification",
    "MPNetForTokenClassification",
    "MPNetModel",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
    "RobertaForTokenClassification",
    "RobertaModel",
    "T5EncoderModel",
    "T5ForConditionalGeneration",
    "T5ForSequenceClassification",
    "T5ForTokenClassification",
    "T5Model",
    "WhisperForAudioClassification",
    "WhisperForConditionalGeneration",
    "WhisperModel",
    "XLMRobertaForMaskedLM",
    "XLMRobertaForSequenceClassification",
    "XLMRobertaForTokenClassification",
    "XLMRobertaModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertModel",
    "GPT2LMHeadModel",
    "GPT2Model",
    "LlamaForCausalLM",
    "LlamaModel",
    "MistralForCausalLM",
    "MistralModel",
    "Qwen2ForCausalLM",
    "Qwen2Model",
    "ResNetForImageClassification",
    "ResNetModel",
    "TorchvisionResNet",
    "ViTForImageClassification",
    "ViTModel",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet101",
    "resnet152",
    "resnext50_32x4d",
    "resnext101_32x8d",
    "resnext101_64x4d",
    "wide_resnet50_2",
    "wide_resnet101_2",
]
