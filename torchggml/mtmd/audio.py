"""Audio as llama.cpp's mtmd preprocesses it for the whisper encoders (mtmd-audio.cpp): 16 kHz
mono samples to whisper's log-mel spectrogram, cut into 30-second chunks of 3000 frames.

The samples get 200 reflected samples in front and 30 s of silence (plus 200 zeros) behind; each
frame of 400 samples (hop 160) is weighted by a periodic Hann window, its power spectrum (FFT
400) mapped by a Slaney mel filterbank (built in float64, stored float32, as llama.cpp's), and
log10'd with a floor of 2^-24; the whole spectrogram is clamped to its maximum - 8 and mapped by
(x + 4) / 4. Chunks are the full 3000-frame windows (the silence makes at least one).

Decoding: float arrays (mono, 16 kHz), or WAV files (PCM 16/32-bit, any channel count, 16 kHz)
through the standard library; other formats and rates: decode and resample first."""
from __future__ import annotations

import io
import math
import os
import struct
import wave

import numpy as np
import torch

from .loader import AudioHParams


def load_audio(source, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 samples from a float array / tensor, or a WAV file (a path or its bytes) at
    `sample_rate`."""
    if isinstance(source, torch.Tensor):
        source = source.detach().cpu().numpy()
    if isinstance(source, np.ndarray):
        if source.ndim != 1 or not np.issubdtype(source.dtype, np.floating):
            raise ValueError(f"audio array: expected float mono samples [n], got {source.dtype} {list(source.shape)}")
        return source.astype(np.float32)
    is_bytes = isinstance(source, (bytes, bytearray))
    name = "audio bytes" if is_bytes else os.fspath(source)
    try:
        with wave.open(io.BytesIO(source) if is_bytes else name, "rb") as w:
            rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            data = w.readframes(n)
    except (wave.Error, EOFError, struct.error) as e:
        raise ValueError(f"{name}: not a WAV file the standard library can read ({e})") from None
    if rate != sample_rate:
        raise ValueError(f"{name}: {rate} Hz; the encoder needs {sample_rate} Hz (resample it first)")
    if width not in (2, 4):
        raise ValueError(f"{name}: {8 * width}-bit PCM; 16 or 32-bit PCM WAV files are read")
    x = np.frombuffer(data, dtype=np.int16 if width == 2 else np.int32).astype(np.float32)
    x /= 32768.0 if width == 2 else 2147483648.0
    return x.reshape(-1, channels).mean(axis=1, dtype=np.float32)


def mel_filterbank(n_mel: int, n_fft: int, sample_rate: int) -> torch.Tensor:
    """Slaney-scale triangular filters with area normalisation, float32 [n_mel, n_fft / 2 + 1]."""
    min_log_hz, lin_slope, log_step = 1000.0, 3.0 / 200.0, math.log(6.4) / 27.0
    min_log_mel = min_log_hz * lin_slope

    def to_mel(f):
        return f * lin_slope if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / log_step

    def to_hz(m):
        return m / lin_slope if m < min_log_mel else min_log_hz * math.exp((m - min_log_mel) * log_step)

    lo, hi = to_mel(0.0), to_mel(0.5 * sample_rate)
    hz = [to_hz(lo + (hi - lo) * (i / (n_mel + 1))) for i in range(n_mel + 2)]
    bins = n_fft // 2 + 1
    out = np.zeros((n_mel, bins), dtype=np.float64)
    for m in range(n_mel):
        left, center, right = hz[m], hz[m + 1], hz[m + 2]
        norm = 2.0 / max(1e-30, right - left)
        for k in range(bins):
            f = k * sample_rate / n_fft
            if left <= f <= center:
                out[m, k] = (f - left) / max(1e-30, center - left) * norm
            elif center < f <= right:
                out[m, k] = (right - f) / max(1e-30, right - center) * norm
    return torch.from_numpy(out.astype(np.float32))


def log_mel(samples: np.ndarray, hp: AudioHParams) -> list[torch.Tensor]:
    """Whisper's log-mel chunks, each float32 [n_mel, 3000]."""
    n, pad = samples.size, hp.n_fft // 2
    if n == 0:
        raise ValueError("audio: no samples")
    x = np.zeros(max(n, pad + 1), dtype=np.float32)  # at least a reflection's worth, as llama.cpp
    x[:n] = samples
    n = x.size
    padded = np.zeros(n + hp.sample_rate * 30 + 2 * pad, dtype=np.float32)
    padded[pad:pad + n] = x
    padded[:pad] = x[1:pad + 1][::-1]
    n_frames = (padded.size - hp.n_fft) // hp.hop + 1
    i = np.arange(hp.window, dtype=np.float64)
    hann = torch.from_numpy((0.5 * (1.0 - np.cos(2.0 * np.pi * i / hp.window))).astype(np.float32))
    frames = torch.from_numpy(padded).unfold(0, hp.n_fft, hp.hop)[:n_frames]          # [n_frames, n_fft]
    spec = torch.fft.rfft(frames.double() * hann.double(), dim=1)
    power = (spec.real ** 2 + spec.imag ** 2).float()                                  # [n_frames, bins]
    mel = mel_filterbank(hp.n_mel, hp.n_fft, hp.sample_rate).double() @ power.double().T  # [n_mel, n_frames]
    mel = torch.log10(torch.clamp(mel, min=5.960464477539063e-08)).float()
    mel = (torch.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0
    return [mel[:, s:s + hp.chunk_frames].contiguous() for s in range(0, n_frames - hp.chunk_frames + 1, hp.chunk_frames)]
