"""`WhisperForAudioClassification`: Whisper's encoder with a pooled classifier (language
identification, audio tagging).

The encoder's last hidden states, or with `use_weighted_layer_sum` a softmax-weighted sum of
its hidden states (`layer_weights`), go through `projector`, are averaged over the frames and
classified by `classifier`, as `transformers` does. The number of labels is `id2label`'s size
(else `num_labels`, else 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod.models._attention_parts import projection_keys
from treemod.models._base import PretrainedConfig, PretrainedModel, register_architecture
from treemod.models._config_values import num_labels
from treemod.models._whisper import features, whisper_values
from treemod.models._whisper_layers import WhisperEncoder, build_encoder

__all__ = ["WhisperForAudioClassification"]


@register_architecture
class WhisperForAudioClassification(PretrainedModel):
    """Whisper's encoder with a projector and a classifier over the frames' mean.

    Called with `input_features` `(batch, num_mel_bins, 2 * max_source_positions)` (and `key`
    for dropout in training mode); returns `(batch, num_labels)` logits.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.whisper import WhisperForAudioClassification
        >>> config = {"d_model": 16, "encoder_layers": 2, "encoder_attention_heads": 2,
        ...           "encoder_ffn_dim": 32, "num_mel_bins": 8, "max_source_positions": 10,
        ...           "classifier_proj_size": 6, "num_labels": 4, "use_weighted_layer_sum": True}
        >>> model = WhisperForAudioClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_features=jnp.zeros((2, 8, 20))).shape
        (2, 4)
    """

    architecture: ClassVar[str] = "WhisperForAudioClassification"
    model_type: ClassVar[str] = "whisper"

    encoder: WhisperEncoder
    layer_weights: Array | None
    projector: nn.Linear
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights from a config dict (see `WhisperModel.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        v = whisper_values(cls.__name__, config, decoder=False)
        labels = num_labels(cls.__name__, config)
        dtype = jnp.float32 if dtype is None else dtype
        k_enc, k_proj, k_cls = jax.random.split(key, 3)
        layers = v["encoder_layers"] + 1
        weights = jnp.full((layers,), 1.0 / layers, dtype) if v["use_weighted_layer_sum"] else None
        init = nn.init.normal(v["init_std"])
        proj = v["classifier_proj_size"]
        return cls(
            config=config,
            encoder=build_encoder(v, dtype, key=k_enc),
            layer_weights=weights,
            projector=nn.Linear(v["d_model"], proj, True, dtype, weight_init=init, key=k_proj),
            classifier=nn.Linear(proj, labels, True, dtype, weight_init=init, key=k_cls),
        )

    def __call__(self, *, input_features: Any, key: PRNGKeyArray | None = None) -> Array:
        """The logits `(batch, num_labels)`.

        Arguments:
            input_features: `(batch, num_mel_bins, frames)` log-mel features.
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        x = features(type(self).__name__, self.encoder, input_features)
        if self.layer_weights is None:
            hidden = self.encoder(x, key=key)
        else:
            states = jnp.stack(self.encoder.hidden_states(x, key=key), axis=1)
            weights = jax.nn.softmax(self.layer_weights, axis=-1)
            hidden = jnp.sum(states * weights[None, :, None, None], axis=1)
        # The encoder draws its projections' keys from `key` itself: another stream here.
        k_projector, k_classifier = projection_keys(key, 2, stream=1)
        pooled = jnp.mean(self.projector(hidden, key=k_projector), axis=1)
        return self.classifier(pooled, key=k_classifier)
