"""Whisper's input features in JAX: the log-mel spectrogram `WhisperFeatureExtractor` computes.

Audio is zero-padded or cut to `chunk_length` seconds, framed with a periodic Hann window
(centred frames, reflect padding), its power spectrum taken with a real FFT, projected onto a
Slaney-normalised mel filter bank, floored at 1e-10, `log10`-ed, the last frame dropped, each
example clipped to 8 below its maximum and mapped by `(x + 4) / 4`, as the extractor's NumPy path
does (`_np_extract_fbank_features`). The FFT runs in float32 (the extractor keeps its spectrum in
complex64 too); the features agree with the extractor's to about 1e-5.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

__all__ = ["log_mel_features", "mel_filters"]


def _hz_to_mel(hz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    step, knee = 200.0 / 3, 1000.0
    log_step = np.log(6.4) / 27.0
    hz = np.asarray(hz, np.float64)
    mel = hz / step
    above = hz >= knee
    return np.where(above, knee / step + np.log(np.maximum(hz, knee) / knee) / log_step, mel)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    step, knee = 200.0 / 3, 1000.0
    log_step = np.log(6.4) / 27.0
    knee_mel = knee / step
    return np.where(mel >= knee_mel, knee * np.exp(log_step * (mel - knee_mel)), step * mel)


def mel_filters(num_mel_bins: int, n_fft: int, sampling_rate: int) -> np.ndarray:
    """The Slaney mel filter bank `(1 + n_fft // 2, num_mel_bins)` from 0 to 8 kHz (float64).

    Each filter is a triangle between its neighbours' centre frequencies (evenly spaced on the
    mel scale), scaled to unit area (`2 / (right - left)` in Hz).
    """
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), num_mel_bins + 2))
    bins = np.linspace(0, sampling_rate // 2, 1 + n_fft // 2)
    width = np.diff(edges)
    offset = edges[None, :] - bins[:, None]
    rising = -offset[:, :-2] / width[:-1]
    falling = offset[:, 2:] / width[1:]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    result: np.ndarray = triangles * (2.0 / (edges[2:] - edges[:-2]))[None, :]
    return result


def log_mel_features(
    audio: Any,
    *,
    num_mel_bins: int = 80,
    sampling_rate: int = 16000,
    n_fft: int = 400,
    hop_length: int = 160,
    chunk_length: int = 30,
) -> Array:
    """Whisper's log-mel `input_features` of raw audio, as `WhisperFeatureExtractor`'s.

    Arguments:
        audio: mono audio samples at `sampling_rate`, `(samples,)` or `(batch, samples)`;
            padded with zeros or cut to `chunk_length * sampling_rate` samples.
        num_mel_bins: the mel bins (`feature_size`: 80, or 128 for large-v3).
        sampling_rate: the audio's sampling rate (Whisper's is 16000).
        n_fft: the FFT and window size.
        hop_length: the step between frames.
        chunk_length: the seconds of audio per example.

    Returns:
        `(batch, num_mel_bins, chunk_length * sampling_rate // hop_length)` float32 features.

    Example:
        >>> import numpy as np
        >>> from treemod.models.whisper import log_mel_features
        >>> log_mel_features(np.zeros(16000, np.float32)).shape
        (1, 80, 3000)
    """
    x = jnp.asarray(audio, jnp.float32)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise ValueError(
            f"log_mel_features: `audio` must be samples (samples,) or (batch, samples); got "
            f"shape {list(x.shape)}."
        )
    for name, value in (
        ("num_mel_bins", num_mel_bins),
        ("sampling_rate", sampling_rate),
        ("n_fft", n_fft),
        ("hop_length", hop_length),
        ("chunk_length", chunk_length),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"log_mel_features: `{name}` must be a positive int; got {value!r}.")
    features: Array = _features(x, num_mel_bins, sampling_rate, n_fft, hop_length, chunk_length)
    return features


@partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _features(
    x: Array, num_mel_bins: int, sampling_rate: int, n_fft: int, hop_length: int, chunk: int
) -> Array:
    samples = chunk * sampling_rate
    x = x[:, :samples]
    x = jnp.pad(x, ((0, 0), (0, samples - x.shape[1])))
    half = n_fft // 2
    x = jnp.pad(x, ((0, 0), (half, half)), mode="reflect")
    frames = 1 + (x.shape[1] - n_fft) // hop_length
    starts = np.arange(frames - 1) * hop_length  # the last frame is dropped
    windows = x[:, starts[:, None] + np.arange(n_fft)[None, :]]
    hann = np.hanning(n_fft + 1)[:-1].astype(np.float32)  # periodic
    spectrum = jnp.fft.rfft(windows * hann[None, None], axis=-1)
    power = jnp.square(jnp.real(spectrum)) + jnp.square(jnp.imag(spectrum))
    bank = jnp.asarray(mel_filters(num_mel_bins, n_fft, sampling_rate), jnp.float32)
    mel = jnp.einsum("bfk,km->bmf", power, bank, precision=lax.Precision.HIGHEST)
    log_spec = jnp.log10(jnp.maximum(mel, 1e-10))
    top = jnp.max(log_spec, axis=(1, 2), keepdims=True)
    features: Array = (jnp.maximum(log_spec, top - 8.0) + 4.0) / 4.0
    return features
