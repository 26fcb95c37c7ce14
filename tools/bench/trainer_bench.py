#!/usr/bin/env python3
"""The seed's trainer three ways, and the reader alone, in one run on one GPU capped at 24 GiB.

    python3 tools/bench/trainer_bench.py --binary build-gpu/tools/cli/precompute \\
        --media bench-data/trainer --out $OUT                         # the GPU benchmark
    .venv/bin/python tools/bench/trainer_bench.py --quick --binary build/tools/cli/precompute \\
        --out /tmp/trainer-bench                                      # smoke test on the CPU

1. Data, made by precompute in this run: N samples (default 40,000), each a caption of N(12, 5)
   random words, a video and an audio track taken from a few tiny clips (--media, or made here
   with the ffmpeg CLI: 1 s of 64x64 H.264 + AAC); `precompute run` embeds them into pooled
   768-d float16 vectors for all three modalities: a randomly initialised BERT-base (precompute's
   native encoder, mean pooling, 64 tokens at most) and two fixed-function TorchScript encoders
   exported here (one frame of 32x32 -> 768, the whole waveform's spectrum -> 768). The clip
   encoders are deliberately cheap: decoding and encoding 40,000 real 10 s videos would take
   the whole time budget, and what is measured downstream (the reader, the head) only sees
   [N, 768] float16 arrays, whatever computed them. Decoding still happens for every sample.
2. Training, `torch.cuda.set_per_process_memory_fraction` capping the process at 24 GiB of the
   card, AMP (autocast float16 + GradScaler), AdamW, the fusion head of
   examples/train_fusion.py (classification over 100 classes, random labels: speed and memory do
   not depend on what is learned), three ways:
     a. encoders fine-tuned in the loop: BERT-base (random init from a transformers config, no
        download) on 64-token captions, torchvision ResNet-50 (random init) on 8 frames of
        224x224 per sample, mean over frames, a small audio CNN on 10 s of 16 kHz audio;
     b. the same encoders in the loop under torch.no_grad() (eval mode), only the head trained;
     c. the head alone on the precomputed vectors (held on the GPU, batches drawn at random);
     c'. the same with the contrastive objective (text <-> video+audio, [B, B] logits).
   Inputs of a and b are random tensors of those shapes already on the GPU: decoding is not
   charged to them. For each way: the largest batch (doubling from 1 until an out-of-memory
   error, then bisection to 1/64), two steps per try; then samples/s at that batch, the median
   of --runs timed runs of >= --seconds each.
3. The reader alone: samples/s of a DataLoader over the output with 0, 4, 8 and 16 workers,
   batches of --reader-batch, random access (ShardDataset, shuffle=True) and shard order
   (ShardIterableDataset, shuffle=True: shards shuffled, rows through its buffer), all three
   pooled modalities; the median of --runs runs of >= --reader-seconds each after the first
   batch. Target: >= 50,000 samples/s with 8 workers.

Writes trainer_bench.json and trainer_bench.md under --out (default $OUT or /tmp/out). A failing
step is recorded with its error and the others still run; exit 1 when any step failed (a missed
target is reported, not a failure). --quick: a CPU smoke test at tiny sizes (300 samples, small
shapes, batch caps instead of out-of-memory errors, 0 and 2 workers, one run).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the GPU machine has no network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "python"))
import precompute_run  # noqa: E402  (runs precompute, reads its summary)
import text_throughput as tt  # noqa: E402  (random vocabulary, tokenizer)
import train_fusion  # noqa: E402  (the fusion head and its losses)
from torch.utils.data import DataLoader  # noqa: E402

import precompute  # noqa: E402

GIB = 1 << 30
MODALITIES = ("video", "audio", "text")
NUM_CLASSES = 100


def log(msg: str) -> None:
    print(f"[trainer_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# 1. Data, made by precompute
# ------------------------------------------------------------------------------------------------

def make_media(dest: Path, clips: int = 8) -> Path:
    """`clips` clips of 1 s, 64x64 H.264 at 8 fps with an AAC sine track, by the ffmpeg CLI
    (not on the GPU machine: make them on the Debian machine with --make-media and carry)."""
    if shutil.which("ffmpeg") is None:
        raise RuntimeError("no ffmpeg CLI on this machine: make the clips where there is one "
                           "(trainer_bench.py --make-media bench-data/trainer), carry them and "
                           "pass --media bench-data/trainer")
    dest.mkdir(parents=True, exist_ok=True)
    sources = ["testsrc2", "smptebars", "rgbtestsrc", "testsrc", "yuvtestsrc", "pal75bars",
               "smptehdbars", "color=c=red"]
    for k in range(clips):
        path = dest / f"clip{k}.mp4"
        if path.exists():
            continue
        src = sources[k % len(sources)]
        src += (":" if "=" in src else "=") + "s=64x64:r=8:d=1"
        cmd = ["ffmpeg", "-nostdin", "-y", "-hide_banner", "-loglevel", "error",
               "-f", "lavfi", "-i", src,
               "-f", "lavfi", "-i", f"sine=frequency={220 * (k + 1)}:sample_rate=16000:duration=1",
               "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
               "-c:a", "aac", "-b:a", "32k", "-shortest", str(path)]
        subprocess.run(cmd, check=True)
    return dest


class FrameTo768(nn.Module):
    """[N, 3, H, W] -> [N, 768]: 8x8 colour grid through a fixed random projection."""

    def __init__(self, dim: int = 768):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randn(192, dim, generator=g) / math.sqrt(192))

    def forward(self, frames: Tensor) -> Tensor:
        x = F.adaptive_avg_pool2d(frames.float(), 8).flatten(1)
        return torch.tanh(x @ self.w)


class WaveTo768(nn.Module):
    """([N, S], lengths [N]) -> [N, 768]: 64 bands of the log spectrum, fixed projection."""

    def __init__(self, dim: int = 768):
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.register_buffer("w", torch.randn(64, dim, generator=g) / 8.0)

    def forward(self, wave: Tensor, lengths: Tensor) -> Tensor:
        s = torch.fft.rfft(wave.float(), dim=1).abs()
        x = torch.log1p(F.adaptive_avg_pool1d(s[:, None, :], 64)[:, 0, :])
        return torch.tanh(x @ self.w)


def make_bert_folder(model_dir: Path, layers: int, seed: int = 0) -> List[str]:
    """A random BERT-base folder (config, safetensors, vocab.txt, tokenizer) over 20,000 random
    words, as text_throughput.py makes it; `layers` < 12 for the CPU smoke test. Returns the
    words."""
    rng = random.Random(seed)
    words = set()
    while len(words) < 20000:
        words.add("".join(rng.choice(tt.LETTERS) for _ in range(rng.randint(2, 9))))
    words = sorted(words)
    stamp = model_dir / "stamp.json"
    params = {"layers": layers, "seed": seed, "version": 1}
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return words
    from transformers import BertConfig, BertModel
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    (model_dir / "vocab.txt").write_text("\n".join(tt.SPECIALS + words) + "\n")
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(words) + len(tt.SPECIALS), num_hidden_layers=layers)) \
        .save_pretrained(model_dir, safe_serialization=True)
    tt.make_tokenizer(model_dir / "vocab.txt", 64).save_pretrained(model_dir)
    stamp.write_text(json.dumps(params))
    return words


def generate(args, work: Path) -> dict:
    """Runs precompute on N samples; returns the output folder and the run's figures."""
    media = Path(args.media) if args.media else make_media(work / "media")
    clips = sorted(media.glob("*.mp4"))
    if not clips:
        raise RuntimeError(f"no .mp4 clips in {media}")
    words = make_bert_folder(work / "bert-random", args.bert_layers)
    enc = work / "encoders"
    enc.mkdir(exist_ok=True)
    torch.jit.save(torch.jit.script(FrameTo768().eval()), str(enc / "video768.pt"))
    torch.jit.save(torch.jit.script(WaveTo768().eval()), str(enc / "audio768.pt"))
    rng = random.Random(1)
    manifest = work / f"manifest-{args.samples}.jsonl"
    with open(manifest, "w") as f:
        for i in range(args.samples):
            clip = str(clips[i % len(clips)].resolve())
            text = " ".join(rng.choices(words, k=max(3, int(rng.gauss(12, 5)))))
            f.write(json.dumps({"id": f"s{i:07d}", "video": clip, "audio": clip,
                                "text": text}) + "\n")
    out = work / "out"
    gpu = args.device.startswith("cuda")
    cfg = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "dtype": "float16", "shard_size": args.shard_size,
                   "overwrite": True},
        "run": {"device": args.device, "progress_interval_s": 0},
        "video": {"encoder": {"path": str(enc / "video768.pt")}, "sampling": {"num_frames": 1},
                  "size": 32, "pooling": "mean", "batch_size": 1024},
        "audio": {"encoder": {"path": str(enc / "audio768.pt")}, "sample_rate": 16000,
                  "pooling": "mean", "batch_size": 1024},
        "text": {"encoder": {"type": "bert", "path": str(work / "bert-random")},
                 "dtype": "bfloat16" if gpu else "float32", "batch_size": 4096 if gpu else 64,
                 "pooling": "mean", "tokenizer": {"vocab": str(work / "bert-random" / "vocab.txt"),
                                                  "max_length": 64}},
    }
    cfg_path = work / "precompute.yaml"
    cfg_path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    log(f"precompute: {args.samples:,} samples ({len(clips)} clips) -> {out}")
    # Its log and summary: OUT/precompute.log, OUT/precompute.summary.json.
    run = precompute_run.run_precompute(Path(args.binary), cfg_path, Path(args.out) / "precompute",
                                        timeout=args.precompute_timeout)
    wall = run.wall_s
    summary = run.figures()
    if summary["with_embeddings"] != args.samples:
        raise RuntimeError(f"precompute embedded {summary['with_embeddings']} of "
                           f"{args.samples} samples, summary {summary}:\n{run.error_tail(30)}")
    index = json.loads((out / "index.json").read_text())
    dims = {m: (v["dim"], v["layout"]) for m, v in index["modalities"].items()}
    if any(dims.get(m) != (768, "pooled") for m in MODALITIES):
        raise RuntimeError(f"expected pooled 768-d video, audio and text, got {dims}")
    res = {"out": str(out), "cmd": " ".join(run.cmd), "wall_s": wall,
           "per_s_wall": args.samples / wall,
           "summary": summary, "bytes": sum(s["bytes"] for s in index["shards"]),
           "shards": len(index["shards"]), "dims": dims}
    log(f"precompute: {args.samples:,} samples in {wall:.1f} s ({res['per_s_wall']:,.0f}/s "
        f"whole process), {res['shards']} shards, {res['bytes'] / 1e6:.0f} MB")
    return res


# ------------------------------------------------------------------------------------------------
# 2. The three ways
# ------------------------------------------------------------------------------------------------

def resnet50() -> nn.Module:
    """torchvision's ResNet-50 (random init, the classifier removed: 2048-d features); where
    torchvision is missing (the CPU smoke test), the same architecture written out here."""
    try:
        import torchvision
        m = torchvision.models.resnet50(weights=None)
        m.fc = nn.Identity()
        return m
    except ImportError:
        pass

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Tensor) -> Tensor:
            return F.relu(self.body(x) + self.down(x))

    layers: List[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())


class AudioCNN(nn.Module):
    """A small audio CNN: log-mel-like spectrogram (STFT, 64 bands) -> 4 conv blocks -> 768."""

    def __init__(self, dim: int = 768):
        super().__init__()
        chans = [1, 32, 64, 128, 256]
        self.convs = nn.Sequential(*[nn.Sequential(nn.Conv2d(a, b, 3, 2, 1, bias=False),
                                                   nn.BatchNorm2d(b), nn.ReLU(True))
                                     for a, b in zip(chans, chans[1:])])
        self.out = nn.Linear(256, dim)
        self.register_buffer("window", torch.hann_window(400))

    def forward(self, wave: Tensor) -> Tensor:
        spec = torch.stft(wave.float(), 400, 160, window=self.window, return_complex=True).abs()
        spec = F.adaptive_avg_pool2d(torch.log1p(spec)[:, None], (64, spec.shape[-1]))
        return self.out(self.convs(spec).mean(dim=(2, 3)))


class InLoopEncoders(nn.Module):
    """BERT-base (mean over tokens), ResNet-50 (mean over frames) and the audio CNN."""

    def __init__(self, bert_layers: int, vocab: int = 30522):
        super().__init__()
        from transformers import BertConfig, BertModel
        self.bert = BertModel(BertConfig(vocab_size=vocab, num_hidden_layers=bert_layers),
                              add_pooling_layer=False)
        self.resnet = resnet50()
        self.audio = AudioCNN()

    def forward(self, ids: Tensor, mask: Tensor, frames: Tensor, wave: Tensor) -> Dict[str, Tensor]:
        hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].to(hidden.dtype)
        text = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        b, t = frames.shape[:2]
        video = self.resnet(frames.flatten(0, 1)).view(b, t, -1).mean(1)
        return {"video": video, "audio": self.audio(wave), "text": text}


class Way:
    """One way of training: `inputs(batch)` makes a batch on the device, `loss(inputs)` runs the
    forward pass, `params` are what the optimiser updates."""

    def __init__(self, name: str, params: List[nn.Parameter], inputs: Callable[[int], dict],
                 loss: Callable[[dict], Tensor], train: Callable[[], None]):
        self.name, self.params, self.inputs, self.loss, self.train = name, params, inputs, loss, train


def make_ways(args, device: torch.device, group: str, data: Optional[Dict[str, Tensor]] = None
              ) -> Dict[str, Way]:
    """The ways of `group`: "ab" (the encoders in the loop) or "c" (the head on `data`)."""
    ways: Dict[str, Way] = {}
    present_all = lambda b: {m: torch.ones(b, dtype=torch.bool, device=device) for m in MODALITIES}  # noqa: E731
    classes = lambda b: torch.randint(NUM_CLASSES, (b,), device=device)  # noqa: E731

    if group == "ab":
        encoders = InLoopEncoders(args.bert_layers, args.bert_vocab).to(device)
        head_in = train_fusion.FusionHead({"video": 2048, "audio": 768, "text": 768},
                                          num_classes=NUM_CLASSES).to(device)

        def raw_inputs(b: int) -> dict:
            return {"ids": torch.randint(len(tt.SPECIALS), args.bert_vocab, (b, args.tokens),
                                         device=device),
                    "mask": torch.ones(b, args.tokens, dtype=torch.long, device=device),
                    "frames": torch.randn(b, args.frames, 3, args.image, args.image, device=device),
                    "wave": torch.randn(b, int(args.audio_s * 16000), device=device),
                    "y": classes(b)}

        def loss_a(x: dict) -> Tensor:
            feats = encoders(x["ids"], x["mask"], x["frames"], x["wave"])
            b = x["y"].shape[0]
            return train_fusion.classification_loss(head_in, feats, present_all(b), x["y"])[0]

        def loss_b(x: dict) -> Tensor:
            with torch.no_grad():
                feats = encoders(x["ids"], x["mask"], x["frames"], x["wave"])
            b = x["y"].shape[0]
            return train_fusion.classification_loss(head_in, feats, present_all(b), x["y"])[0]

        def train_a() -> None:
            encoders.train()
            head_in.train()

        def train_b() -> None:
            encoders.eval()
            head_in.train()

        ways["a"] = Way("a. encoders fine-tuned in the loop",
                        list(encoders.parameters()) + list(head_in.parameters()),
                        raw_inputs, loss_a, train_a)
        ways["b"] = Way("b. encoders in the loop under no_grad", list(head_in.parameters()),
                        raw_inputs, loss_b, train_b)

    if group == "c":
        n = data["text"].shape[0]
        head = train_fusion.FusionHead({m: 768 for m in MODALITIES},
                                       num_classes=NUM_CLASSES).to(device)
        clip = train_fusion.FusionHead({m: 768 for m in MODALITIES}, fuse=["video", "audio"]) \
            .to(device)
        labels = torch.randint(NUM_CLASSES, (n,), device=device)

        def pre_inputs(b: int) -> dict:
            idx = torch.randint(n, (b,), device=device)
            # As examples/train_fusion.py: stored float16, cast to float32 on the device.
            return {"feats": {m: data[m][idx].float() for m in MODALITIES},
                    "present": {m: data[m + "_present"][idx] for m in MODALITIES},
                    "y": labels[idx]}

        ways["c"] = Way("c. head on precomputed tensors", list(head.parameters()), pre_inputs,
                        lambda x: train_fusion.classification_loss(head, x["feats"], x["present"],
                                                                   x["y"])[0],
                        head.train)
        ways["c2"] = Way("c'. head on precomputed tensors, contrastive", list(clip.parameters()),
                         pre_inputs,
                         lambda x: train_fusion.contrastive_loss(clip, x["feats"], x["present"])[0],
                         clip.train)
    return ways


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(way: Way, batch: int, steps: int, device: torch.device) -> float:
    """`steps` training steps at `batch` (fresh optimiser and scaler); seconds taken."""
    amp = device.type == "cuda"
    way.train()
    opt = torch.optim.AdamW(way.params, lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    x = way.inputs(batch)
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            loss = way.loss(x)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    sync(device)
    return time.perf_counter() - t


def release(way: Way, device: torch.device) -> None:
    for p in way.params:
        p.grad = None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(e: BaseException) -> bool:
    """An out-of-memory error, including cuDNN's and cuBLAS's failed workspace allocations."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in text or "ALLOC_FAILED" in text)


def fits(way: Way, batch: int, device: torch.device) -> bool:
    try:
        run_steps(way, batch, 2, device)
        ok = True
    except RuntimeError as e:  # torch.OutOfMemoryError is one
        if not is_oom(e):
            raise
        ok = False
    release(way, device)
    return ok


def largest_batch(way: Way, cap: int, device: torch.device, start: int = 1) -> dict:
    """Doubling from `start` until a try runs out of memory (or passes `cap`), then bisection
    to 1/64 of the batch."""
    tries, lo, b = [], 0, start
    while b <= cap:
        ok = fits(way, b, device)
        tries.append((b, ok))
        if not ok:
            break
        lo, b = b, b * 2
    capped = b > cap
    hi = b
    if not capped:
        while hi - lo > max(1, lo // 64):
            mid = (lo + hi) // 2
            ok = fits(way, mid, device)
            tries.append((mid, ok))
            lo, hi = (mid, hi) if ok else (lo, mid)
    return {"largest_batch": lo, "capped": capped, "cap": cap, "tries": tries}


def throughput(way: Way, batch: int, args, device: torch.device) -> dict:
    """Samples/s at `batch`: warm-up, then --runs runs of >= --seconds; the median. A batch
    that no longer fits (fragmentation) is lowered by 5% up to 3 times."""
    for _ in range(4):
        try:
            step_s = run_steps(way, batch, 2, device) / 2
            steps = max(3, math.ceil(args.seconds / max(step_s, 1e-6)))
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            rates = [batch * steps / run_steps(way, batch, steps, device)
                     for _ in range(args.runs)]
            res = {"batch": batch, "steps_per_run": steps, "runs": rates,
                   "samples_per_s": statistics.median(rates)}
            if device.type == "cuda":
                res["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / GIB
            release(way, device)
            return res
        except RuntimeError as e:
            if not is_oom(e):
                raise
            release(way, device)
            batch = max(1, int(batch * 0.95))
    raise RuntimeError(f"{way.name}: out of memory at batch {batch} after lowering it 3 times")


def load_precomputed(out: Path, device: torch.device) -> Dict[str, Tensor]:
    """Every sample's three vectors (float16) and presence flags on the device, read with the
    package's reader."""
    data = precompute.ShardDataset(out)
    loader = DataLoader(data, batch_size=4096, num_workers=0, collate_fn=precompute.collate)
    parts: Dict[str, List[Tensor]] = {}
    for batch in loader:
        for m in MODALITIES:
            parts.setdefault(m, []).append(batch[m]["embedding"])
            parts.setdefault(m + "_present", []).append(batch[m]["present"])
    return {k: torch.cat(v).to(device) for k, v in parts.items()}


# ------------------------------------------------------------------------------------------------
# 3. The reader alone
# ------------------------------------------------------------------------------------------------

def reader_rate(out: Path, access: str, workers: int, args) -> float:
    """Samples/s of one DataLoader over the output, from its first batch on, for at least
    --reader-seconds (several epochs where needed; workers persist across them)."""
    if access == "random":
        data = precompute.ShardDataset(out)
        loader = DataLoader(data, batch_size=args.reader_batch, shuffle=True, num_workers=workers,
                            collate_fn=precompute.collate, persistent_workers=workers > 0)
    else:
        data = precompute.ShardIterableDataset(out, shuffle=True)
        loader = DataLoader(data, batch_size=args.reader_batch, num_workers=workers,
                            collate_fn=precompute.collate, persistent_workers=workers > 0)
    n, start, epoch = 0, None, 0
    while True:
        if hasattr(data, "set_epoch"):
            data.set_epoch(epoch)
        for batch in loader:
            assert batch["video"]["embedding"].shape[1] == 768
            if start is None:
                start = time.perf_counter()  # worker start-up and the first batch not counted
                continue
            n += len(batch["id"])
            if time.perf_counter() - start >= args.reader_seconds:
                break
        epoch += 1
        if start is not None and time.perf_counter() - start >= args.reader_seconds:
            break
    rate = n / (time.perf_counter() - start)
    del loader
    return rate


def bench_reader(out: Path, args) -> dict:
    res = {}
    for access in ("random", "shard"):
        for w in args.workers:
            rates = [reader_rate(out, access, w, args) for _ in range(args.runs)]
            res[f"{access}/{w}"] = {"access": access, "workers": w, "runs": rates,
                                    "samples_per_s": statistics.median(rates)}
            log(f"reader {access:6s} {w:2d} workers: {statistics.median(rates):,.0f} samples/s "
                f"(runs {', '.join(f'{r:,.0f}' for r in rates)})")
    return res


def bench_example(shards: Path, args) -> dict:
    """examples/train_fusion.py itself on the output, as a user runs it (its own process, on
    --device, AMP on CUDA, --example-workers workers): samples/s of its epochs after the first
    (the median), the reader and the head together."""
    metrics = Path(args.out) / "train_fusion_metrics.json"
    cmd = [sys.executable, str(ROOT / "examples" / "train_fusion.py"), str(shards),
           "--device", args.device, "--epochs", str(args.example_epochs),
           "--batch-size", str(args.example_batch), "--workers", str(args.example_workers),
           "--metrics", str(metrics)]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (Path(args.out) / "train_fusion.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"train_fusion.py exit {p.returncode}:\n{p.stderr[-3000:]}")
    m = json.loads(metrics.read_text())
    rates = [e["samples_per_s"] for e in m["epochs"][1:]] or [m["epochs"][0]["samples_per_s"]]
    res = {"cmd": " ".join(cmd), "wall_s": time.perf_counter() - t, "amp": m["amp"],
           "losses": [e["loss"] for e in m["epochs"]], "epoch_rates": rates,
           "samples_per_s": statistics.median(rates)}
    log(f"examples/train_fusion.py: {res['samples_per_s']:,.0f} samples/s (batch "
        f"{args.example_batch}, {args.example_workers} workers, amp {m['amp']}), losses "
        f"{', '.join(f'{x:.3f}' for x in res['losses'])}")
    return res


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def fmt(v, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def report(res: dict) -> str:
    lines = [f"trainer_bench {res['started']} on {res['device_name']}, memory cap "
             f"{res.get('memory_cap_gib', '-')} GiB, {res['args']['samples']:,} samples", ""]
    if "precompute" in res:
        p = res["precompute"]
        lines += [f"precompute: {p['per_s_wall']:,.0f} samples/s whole process "
                  f"({p['wall_s']:.1f} s), {p['shards']} shards, {p['bytes'] / 1e6:.0f} MB", ""]
    lines += ["| way | largest batch | samples/s at it | peak allocated |", "|---|---:|---:|---:|"]
    for key, w in res.get("ways", {}).items():
        if "error" in w:
            lines.append(f"| {w.get('name', key)} | error: {w['error'].splitlines()[-1]} | | |")
            continue
        largest = f"{'>= ' if w['capped'] else ''}{w['largest_batch']:,}"
        t = w.get("throughput", {})
        lines.append(f"| {w['name']} | {largest} | {fmt(t.get('samples_per_s'))} "
                     f"(batch {t.get('batch', '-')}) | {fmt(t.get('peak_allocated_gib'), 1)} GiB |")
    if res.get("example"):
        e = res["example"]
        lines += ["", f"examples/train_fusion.py end to end (batch {res['args']['example_batch']},"
                  f" {res['args']['example_workers']} workers, contrastive, AMP {e['amp']}): "
                  f"{fmt(e['samples_per_s'])} samples/s"]
    if res.get("reader"):
        ws = res["args"]["workers"]
        lines += ["", "| reader samples/s | " + " | ".join(f"{w} workers" for w in ws) + " |",
                  "|---|" + "---:|" * len(ws)]
        for access, label in (("random", "random (ShardDataset)"),
                              ("shard", "shard order (ShardIterableDataset)")):
            lines.append(f"| {label} | " + " | ".join(
                fmt(res["reader"].get(f"{access}/{w}", {}).get("samples_per_s")) for w in ws)
                + " |")
        t = res.get("reader_target")
        if t:
            lines += ["", f"target >= {t['target']:,} samples/s with 8 workers: random "
                      f"{fmt(t['random'])}, shard order {fmt(t['shard'])}: "
                      f"{'met' if t['met'] else 'missed'}"]
    if res.get("errors"):
        lines += ["", "errors: " + "; ".join(res["errors"])]
    return "\n".join(lines) + "\n"


def bench_way(key: str, way: Way, args, device: torch.device, res: dict) -> dict:
    """Largest batch and samples/s of one way; an error is recorded, not raised."""
    t0 = time.perf_counter()
    entry: dict = {"name": way.name}
    try:
        cap = args.cap_head if key.startswith("c") else args.cap_in_loop
        # A contrastive batch needs two samples.
        entry.update(largest_batch(way, cap, device, start=2 if key == "c2" else 1))
        log(f"{way.name}: largest batch {'>= ' if entry['capped'] else ''}"
            f"{entry['largest_batch']:,} ({len(entry['tries'])} tries)")
        entry["throughput"] = throughput(way, entry["largest_batch"], args, device)
        log(f"{way.name}: {entry['throughput']['samples_per_s']:,.0f} samples/s at batch "
            f"{entry['throughput']['batch']:,}")
    except Exception:
        entry["error"] = traceback.format_exc()
        res["errors"].append(f"{key}: " + entry["error"].splitlines()[-1])
        log(entry["error"])
    entry["seconds"] = time.perf_counter() - t0
    return entry


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=str(ROOT / "build-gpu" / "tools" / "cli" / "precompute"))
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    p.add_argument("--work", default="/tmp/trainer-bench", help="data, models, shards")
    p.add_argument("--media", help="folder of .mp4 clips (default: made here with ffmpeg)")
    p.add_argument("--make-media", metavar="DIR", help="only write the clips to DIR and exit")
    p.add_argument("--quick", action="store_true", help="CPU smoke test at tiny sizes")
    p.add_argument("--device", help="default: cuda (cpu with --quick)")
    p.add_argument("--samples", type=int, help="samples to generate (default 40,000; quick 300)")
    p.add_argument("--shard-size", type=int, help="samples per shard (4,096; quick 128)")
    p.add_argument("--memory-gib", type=float, default=24.0, help="per-process GPU memory cap")
    p.add_argument("--ways", default="a,b,c,c2", help="which ways to train (none: '')")
    p.add_argument("--frames", type=int, help="frames per sample in the loop (8; quick 1)")
    p.add_argument("--image", type=int, help="frame size in the loop (224; quick 64)")
    p.add_argument("--tokens", type=int, help="caption tokens in the loop (64; quick 8)")
    p.add_argument("--audio-s", type=float, help="audio seconds in the loop (10; quick 0.5)")
    p.add_argument("--bert-layers", type=int, help="BERT layers (12; quick 1)")
    p.add_argument("--bert-vocab", type=int, help="in-loop BERT vocabulary (30,522; quick 1,000)")
    p.add_argument("--cap-in-loop", type=int, help="largest batch tried for a, b (4096; quick 2)")
    p.add_argument("--cap-head", type=int, help="largest batch tried for c (2^22; quick 256)")
    p.add_argument("--seconds", type=float, help="seconds per timed run (3; quick 0.1)")
    p.add_argument("--runs", type=int, help="timed runs, median taken (3; quick 1)")
    p.add_argument("--workers", help="reader worker counts (0,4,8,16; quick 0,2)")
    p.add_argument("--reader-batch", type=int, help="reader batch size (1,024; quick 64)")
    p.add_argument("--reader-seconds", type=float, help="seconds per reader run (3; quick 0.5)")
    p.add_argument("--no-reader", action="store_true")
    p.add_argument("--no-example", action="store_true", help="skip examples/train_fusion.py")
    p.add_argument("--example-batch", type=int, help="train_fusion.py batch (4,096; quick 64)")
    p.add_argument("--example-workers", type=int, help="train_fusion.py workers (8; quick 2)")
    p.add_argument("--example-epochs", type=int, default=3)
    p.add_argument("--precompute-timeout", type=int, default=300)
    a = p.parse_args(argv)
    q = a.quick
    defaults = {"device": "cpu" if q else "cuda", "samples": 300 if q else 40000,
                "frames": 1 if q else 8, "image": 64 if q else 224, "tokens": 8 if q else 64,
                "audio_s": 0.5 if q else 10.0, "bert_layers": 1 if q else 12,
                "bert_vocab": 1000 if q else 30522,
                "cap_in_loop": 2 if q else 4096, "cap_head": 256 if q else 1 << 22,
                "seconds": 0.1 if q else 3.0, "runs": 1 if q else 3,
                "workers": "0,2" if q else "0,4,8,16", "reader_seconds": 0.5 if q else 3.0}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.workers = [int(w) for w in str(a.workers).split(",")]
    a.ways = [w for w in a.ways.split(",") if w]
    if a.example_batch is None:
        a.example_batch = 64 if q else 4096
    if a.example_workers is None:
        a.example_workers = 2 if q else 8
    if a.reader_batch is None:
        a.reader_batch = 64 if q else 1024
    if a.shard_size is None:
        a.shard_size = 128 if q else 4096
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.make_media:
        make_media(Path(args.make_media))
        print(f"wrote clips to {args.make_media}")
        return 0
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args),
                 "torch": torch.__version__, "python": platform.python_version(),
                 "device_name": "cpu", "cpu_count": os.cpu_count(), "errors": []}
    try:
        import torchvision
        res["torchvision"] = torchvision.__version__
    except ImportError:
        res["torchvision"] = None
    try:
        import transformers
        res["transformers"] = transformers.__version__
    except ImportError:
        res["transformers"] = None
    t_all = time.perf_counter()

    def save() -> None:
        (out / "trainer_bench.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "trainer_bench.md").write_text(report(res))

    try:
        res["precompute"] = generate(args, work)
    except Exception:
        res["errors"].append("precompute: " + traceback.format_exc().splitlines()[-1])
        log(traceback.format_exc())
        save()
        print(report(res))
        return 1
    save()
    shards = Path(res["precompute"]["out"])

    # The reader before CUDA starts: its workers fork a process that holds no CUDA context.
    if not args.no_reader:
        try:
            res["reader"] = bench_reader(shards, args)
            r8 = {a: res["reader"].get(f"{a}/8", {}).get("samples_per_s") for a in ("random",
                                                                                   "shard")}
            if r8["random"] is not None:
                res["reader_target"] = {"target": 50000, **r8,
                                        "met": min(r8.values()) >= 50000}
        except Exception:
            res["errors"].append("reader: " + traceback.format_exc().splitlines()[-1])
            log(traceback.format_exc())
        save()

    # The example in its own process, before this one holds GPU memory.
    if not args.no_example:
        try:
            res["example"] = bench_example(shards, args)
        except Exception:
            res["errors"].append("example: " + traceback.format_exc().splitlines()[-1])
            log(traceback.format_exc())
        save()

    if device.type == "cuda":
        res["device_name"] = torch.cuda.get_device_name(device)
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1.0, args.memory_gib * GIB / total)
        # It wants an index: torch.device("cuda") has none.
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.set_per_process_memory_fraction(fraction, index)
        res.update({"memory_cap_gib": args.memory_gib, "memory_fraction": fraction,
                    "device_total_gib": total / GIB})
        log(f"GPU memory capped at {args.memory_gib} GiB ({fraction:.4f} of {total / GIB:.1f} GiB)")

    res["ways"] = {}
    # One group of models at a time, freed before the next: what (a) and (b) hold must not
    # shrink the budget of (c).
    for group, keys in (("ab", ("a", "b")), ("c", ("c", "c2"))):
        if not any(k in args.ways for k in keys):
            continue
        try:
            data = load_precomputed(shards, device) if group == "c" else None
            ways = {k: w for k, w in make_ways(args, device, group, data).items()
                    if k in args.ways}
        except Exception:
            res["errors"].append(f"models {group}: " + traceback.format_exc().splitlines()[-1])
            log(traceback.format_exc())
            continue
        for key, way in ways.items():
            res["ways"][key] = bench_way(key, way, args, device, res)
            save()
        del ways, data
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - t_all
    save()
    print(report(res))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
