"""Audio as llama.cpp's mtmd preprocesses it for the whisper encoders (mtmd-audio.cpp): 16 kHz
mono samples to whisper's log-mel spectrogram, cut into 30-second chunks of 3000 frames.

The samples get 200 reflected samples in front and 30 s of silence (plus 200 zeros) behind; each
frame of 400 samples (hop 160) is weighted by a periodic Hann window, its power spectrum (FFT
400) mapped by a Slaney mel filterbank (built in float64, stored float32, as llama.cpp's), and
log10'd with a floor of 2^-24; the whole spectrogram is clamped to its maximum - 8 and mapped by
(x + 4) / 4. Chunks are the full 3000-frame windows (the silence makes at least one).

Decoding: float arrays (mono, 16 kHz); WAV files (PCM 16/32-bit) through the standard library;
other files (mp3, flac, ogg...) through soundfile (the optional extra `audio`: libsndfile 1.1 or
newer reads mp3). Channels are averaged, and any other rate is resampled to 16 kHz as llama.cpp's
miniaudio decoder does (its linear resampler: a 4th-order Butterworth low-pass at the lower
Nyquist frequency, two float32 biquads, then linear interpolation)."""
from __future__ import annotations

import io
import math
import os
import struct
import wave
from math import gcd

import numpy as np
import torch

from .loader import AudioHParams


def load_audio(source, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 samples at `sample_rate` from a float array / tensor (taken as at that rate),
    or an audio file (a path or its bytes): WAV, or another format soundfile reads."""
    if isinstance(source, torch.Tensor):
        source = source.detach().cpu().numpy()
    if isinstance(source, np.ndarray):
        if source.ndim != 1 or not np.issubdtype(source.dtype, np.floating):
            raise ValueError(f"audio array: expected float mono samples [n], got {source.dtype} {list(source.shape)}")
        return source.astype(np.float32)
    is_bytes = isinstance(source, (bytes, bytearray))
    name = "audio bytes" if is_bytes else os.fspath(source)
    if is_bytes:
        head = bytes(source[:4])
    else:
        with open(name, "rb") as f:
            head = f.read(4)
    data = io.BytesIO(source) if is_bytes else name
    x, rate = _read_wav(data, name) if head == b"RIFF" else _read_soundfile(data, name)
    return x if rate == sample_rate else resample(x, rate, sample_rate)


def _read_wav(data, name: str) -> tuple[np.ndarray, int]:
    try:
        with wave.open(data, "rb") as w:
            rate, channels, width, n = w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            frames = w.readframes(n)
    except (wave.Error, EOFError, struct.error) as e:
        raise ValueError(f"{name}: not a WAV file the standard library can read ({e})") from None
    if width not in (2, 4):
        raise ValueError(f"{name}: {8 * width}-bit PCM; 16 or 32-bit PCM WAV files are read")
    x = np.frombuffer(frames, dtype=np.int16 if width == 2 else np.int32).astype(np.float32)
    x /= 32768.0 if width == 2 else 2147483648.0
    return x.reshape(-1, channels).mean(axis=1, dtype=np.float32), rate


def _read_soundfile(data, name: str) -> tuple[np.ndarray, int]:
    try:
        import soundfile
    except ImportError:
        raise ImportError(f"{name}: audio other than WAV needs soundfile: pip install 'torchggml[audio]'") from None
    try:
        x, rate = soundfile.read(data, dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise ValueError(f"{name}: not an audio file libsndfile {soundfile.__libsndfile_version__} can read "
                         f"({e})") from None
    return x.mean(axis=1, dtype=np.float32), int(rate)


_BIQUAD = None  # the compiled float32 biquad (numba, compiled on first use)


def _biquad_f32(x: np.ndarray, b0, b1, b2, a1, a2) -> np.ndarray:
    """A biquad in float32, transposed direct form II (miniaudio's ma_biquad)."""
    global _BIQUAD
    if _BIQUAD is None:
        import numba

        @numba.njit(cache=True)
        def run(x, b0, b1, b2, a1, a2):
            y = np.empty_like(x)
            r1 = np.float32(0.0)
            r2 = np.float32(0.0)
            for i in range(x.size):
                v = x[i]
                out = b0 * v + r1
                r1 = b1 * v - a1 * out + r2
                r2 = b2 * v - a2 * out
                y[i] = out
            return y
        _BIQUAD = run
    f = np.float32
    return _BIQUAD(x, f(b0), f(b1), f(b2), f(a1), f(a2))


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """float32 samples from rate_in to rate_out as miniaudio's linear resampler: the rates reduced
    by their gcd, a 4th-order Butterworth low-pass (cut-off at the lower rate's Nyquist
    frequency) over the input, then each output sample interpolated between the two input
    samples before its time (the first output is the filter's zero state)."""
    g = gcd(rate_in, rate_out)
    rin, rout = rate_in // g, rate_out // g
    y = np.ascontiguousarray(x, dtype=np.float32)
    if rin == rout:
        return y.copy()
    fs, fc = max(rin, rout), min(rin, rout) * 0.5
    w = 2 * math.pi * fc / fs
    s, c = math.sin(w), math.cos(w)
    for k in range(2):  # two biquads, q of the 4th-order Butterworth's pole pairs
        q = 1 / (2 * math.cos((1 + 2 * k) * math.pi / 8))
        a = s / (2 * q)
        a0 = 1 + a
        y = _biquad_f32(y, (1 - c) / 2 / a0, (1 - c) / a0, (1 - c) / 2 / a0, -2 * c / a0, (1 - a) / a0)
    n_out = y.size * rout // rin
    t = np.arange(n_out, dtype=np.int64) * rin       # output k's time, in input samples times rout
    n = 1 + t // rout                                 # inputs loaded: x1 = y[n - 1], x0 = y[n - 2]
    frac = (t % rout).astype(np.float32) / np.float32(rout)
    padded = np.concatenate([np.zeros(1, np.float32), y, np.zeros(1, np.float32)])
    x0, x1 = padded[np.minimum(n - 1, y.size)], padded[np.minimum(n, y.size + 1)]
    return (x0 + (x1 - x0) * frac).astype(np.float32)


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
