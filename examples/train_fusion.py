#!/usr/bin/env python3
"""Train a video + audio + text fusion model on precompute's shards instead of running BERT,
a video CNN and an audio encoder inside the training loop.

    precompute run --config configs/demo.yaml                # once: embeddings -> build/demo/out
    python examples/train_fusion.py build/demo/out --epochs 20 --batch-size 16
    python examples/train_fusion.py OUT --labels manifest.jsonl --label-key label   # supervised

The model is small on purpose: the encoders already ran, offline, so a step costs a few matrix
products on [batch, dim] tensors, and the batch is bounded by the head alone, not by BERT's or
a video CNN's activations (docs/benchmarks.md, "Training from the shards", measures both).

- Data: `precompute.ShardDataset` (random access, `shuffle=True`) or, with `--stream`,
  `ShardIterableDataset` (shard-order streaming with a shuffle buffer, cheaper on slow disks),
  `precompute.collate`, and a DataLoader with `--workers` processes. Per-step modalities (a
  vector per frame, window or token) are mean-pooled over their real steps here; pooled ones
  are used as stored.
- Model (`FusionHead`): per modality LayerNorm -> Linear -> GELU into a common width; a sample
  that lacks a modality (no input, or it failed: `present` is false) gets a learned stand-in
  vector instead, and the presence flags are fed to the fusion MLP, so it knows what is missing.
- Objective: with `--labels FILE` (a JSONL or CSV with an `id` column and `--label-key`, e.g.
  the manifest the output was made from) a classifier over every modality, cross-entropy on the
  labelled samples. Without labels, self-supervised: a CLIP-style contrastive loss between the
  caption (text) and the fused clip (video + audio), over the samples of a batch that have a
  caption and at least one of video or audio.
- Precision: on CUDA, autocast (float16) with a GradScaler; on the CPU, plain float32.

Prints the loss and samples/s of every epoch; `--metrics FILE` writes them as JSON and `--save
FILE` the trained weights.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

try:
    import precompute
except ImportError:  # running from a checkout without `pip install ./python`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    import precompute

MODALITIES = ("video", "audio", "text")


# ---------------------------------------------------------------------------------------------
# Model


class FusionHead(nn.Module):
    """Per-modality projection + fusion MLP over whichever modalities are present.

    `dims`: input width of each modality (e.g. {"video": 768, "audio": 768, "text": 768}).
    `fuse`: the modalities the fusion MLP combines (default: all of `dims`); with
    `num_classes` the output is class logits, else an `embed_dim` vector. Modalities of `dims`
    outside `fuse` are only projected: `embed(name, x)` maps them into the same `embed_dim`
    space (the text tower of the contrastive objective)."""

    def __init__(self, dims: Dict[str, int], fuse: Optional[Sequence[str]] = None,
                 hidden: int = 512, embed_dim: int = 256, num_classes: int = 0,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.fuse = list(fuse) if fuse is not None else list(dims)
        self.proj = nn.ModuleDict({m: nn.Sequential(nn.LayerNorm(d), nn.Linear(d, hidden),
                                                    nn.GELU())
                                   for m, d in dims.items()})
        # What an absent modality contributes: learned, rather than a zero vector that looks
        # like a real (if odd) embedding.
        self.missing = nn.ParameterDict({m: nn.Parameter(torch.zeros(hidden)) for m in dims})
        width = hidden * len(self.fuse) + len(self.fuse)  # + one presence flag per modality
        out = num_classes if num_classes else embed_dim
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, out))
        self.heads = nn.ModuleDict({m: nn.Linear(hidden, embed_dim)
                                    for m in dims if m not in self.fuse})
        # CLIP's learned temperature, initialised to 1 / 0.07.
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def project(self, name: str, x: Tensor, present: Tensor) -> Tensor:
        h = self.proj[name](x)
        return torch.where(present[:, None], h, self.missing[name].to(h.dtype))

    def forward(self, feats: Dict[str, Tensor], present: Dict[str, Tensor]) -> Tensor:
        """[B, out]: logits, or the fused embedding."""
        parts = [self.project(m, feats[m], present[m]) for m in self.fuse]
        flags = torch.stack([present[m] for m in self.fuse], dim=1).to(parts[0].dtype)
        return self.mlp(torch.cat(parts + [flags], dim=1))

    def embed(self, name: str, x: Tensor, present: Tensor) -> Tensor:
        """[B, embed_dim]: a modality outside `fuse`, projected into the fused space."""
        return self.heads[name](self.project(name, x, present))


def contrastive_loss(model: FusionHead, feats: Dict[str, Tensor],
                     present: Dict[str, Tensor]) -> Tuple[Optional[Tensor], int]:
    """Symmetric InfoNCE between the caption and the fused clip, over the rows that have a
    caption and at least one fused modality. (None, n) when fewer than two rows qualify."""
    clip_present = torch.stack([present[m] for m in model.fuse], dim=1).any(dim=1)
    use = present["text"] & clip_present
    n = int(use.sum())
    if n < 2:
        return None, n
    clip = F.normalize(model(feats, present)[use].float(), dim=-1)
    text = F.normalize(model.embed("text", feats["text"], present["text"])[use].float(), dim=-1)
    logits = model.logit_scale.clamp(max=math.log(100)).exp() * clip @ text.T
    target = torch.arange(n, device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2, n


def classification_loss(model: FusionHead, feats: Dict[str, Tensor], present: Dict[str, Tensor],
                        labels: Tensor) -> Tuple[Optional[Tensor], int, int]:
    """Cross-entropy over the labelled rows (label >= 0): (loss, rows, correct)."""
    use = labels >= 0
    n = int(use.sum())
    if n == 0:
        return None, 0, 0
    logits = model(feats, present)[use].float()
    correct = int((logits.argmax(1) == labels[use]).sum())
    return F.cross_entropy(logits, labels[use]), n, correct


# ---------------------------------------------------------------------------------------------
# Data


def batch_features(batch: dict, modalities: Sequence[str],
                   device: torch.device) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
    """A collated batch -> ({modality: float32 [B, dim]}, {modality: bool [B]}) on `device`.
    Per-step modalities are mean-pooled over their real steps (the mask)."""
    feats, present = {}, {}
    for m in modalities:
        entry = batch[m]
        present[m] = entry["present"].to(device, non_blocking=True)
        if "embedding" in entry:
            feats[m] = entry["embedding"].to(device, non_blocking=True).float()
            continue
        values = entry["values"].to(device, non_blocking=True).float()
        mask = entry["mask"].to(device, non_blocking=True)
        total = (values * mask[..., None]).sum(1)
        feats[m] = total / mask.sum(1, keepdim=True).clamp(min=1)
    return feats, present


def read_labels(path: Path, key: str) -> Tuple[Dict[str, int], List[str]]:
    """{id: class index} and the class names (sorted) from a JSONL or CSV/TSV file with an `id`
    column and a `key` column; rows without the key are unlabelled."""
    rows = []
    if path.suffix in (".csv", ".tsv"):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    else:
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    raw = {str(r["id"]): str(r[key]) for r in rows if r.get(key) not in (None, "")}
    if not raw:
        raise SystemExit(f"{path}: no row has a {key!r} value")
    classes = sorted(set(raw.values()))
    index = {c: i for i, c in enumerate(classes)}
    return {i: index[c] for i, c in raw.items()}, classes


def make_loader(out: Path, modalities: Sequence[str], args, device: torch.device):
    """(dataset, DataLoader) over the output folder."""
    if args.stream:
        data = precompute.ShardIterableDataset(out, modalities=modalities, shuffle=True,
                                               seed=args.seed)
        shuffle = None
    else:
        data = precompute.ShardDataset(out, modalities=modalities)
        shuffle = True
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=shuffle,
                        num_workers=args.workers, collate_fn=precompute.collate,
                        pin_memory=device.type == "cuda", persistent_workers=args.workers > 0,
                        generator=torch.Generator().manual_seed(args.seed) if shuffle else None)
    return data, loader


# ---------------------------------------------------------------------------------------------
# Training


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="precompute's output folder")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (default: cuda if any)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=4, help="DataLoader worker processes")
    p.add_argument("--stream", action="store_true",
                   help="ShardIterableDataset (shard order) instead of ShardDataset (random)")
    p.add_argument("--modalities", nargs="+", choices=MODALITIES,
                   help="default: every modality the output has")
    p.add_argument("--labels", type=Path, help="JSONL/CSV with id and --label-key columns")
    p.add_argument("--label-key", default="label")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--embed-dim", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", type=Path, help="write per-epoch loss and samples/s as JSON")
    p.add_argument("--save", type=Path, help="write the trained weights (state_dict) here")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    amp = device.type == "cuda"

    index = precompute.OutputIndex(args.out)
    modalities = [m for m in (args.modalities or MODALITIES) if m in index.modalities]
    labels, classes = read_labels(args.labels, args.label_key) if args.labels else (None, [])
    if labels is None and ("text" not in modalities or len(modalities) < 2):
        raise SystemExit(f"{args.out} has {sorted(index.modalities)}: the contrastive objective "
                         f"needs text and video or audio; give --labels for a classifier")
    dims = {m: index.modalities[m].dim for m in modalities}
    fuse = modalities if labels is not None else [m for m in modalities if m != "text"]
    model = FusionHead(dims, fuse=fuse, hidden=args.hidden, embed_dim=args.embed_dim,
                       num_classes=len(classes)).to(device)
    data, loader = make_loader(args.out, modalities, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    # float16 autocast needs loss scaling; the scaler is a no-op when disabled (CPU).
    scaler = torch.amp.GradScaler(device.type, enabled=amp)
    objective = f"classification over {len(classes)} classes" if labels is not None else \
        f"contrastive text <-> {'+'.join(fuse)}"
    print(f"train_fusion: {len(data)} samples of {args.out}, {dims}, {objective}, device "
          f"{device}{' (autocast float16 + GradScaler)' if amp else ' (float32)'}, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters", flush=True)

    history, step = [], 0
    for epoch in range(args.epochs):
        if hasattr(data, "set_epoch"):
            data.set_epoch(epoch)
        model.train()
        total, rows, correct, seen = 0.0, 0, 0, 0
        start = time.perf_counter()
        for batch in loader:
            feats, present = batch_features(batch, modalities, device)
            with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
                if labels is not None:
                    y = torch.tensor([labels.get(i, -1) for i in batch["id"]], device=device)
                    loss, n, c = classification_loss(model, feats, present, y)
                    correct += c
                else:
                    loss, n = contrastive_loss(model, feats, present)
            seen += len(batch["id"])
            if loss is None:
                continue
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            total += float(loss.detach()) * n
            rows += n
            step += 1
            if args.max_steps and step >= args.max_steps:
                break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        record = {"epoch": epoch, "loss": total / max(rows, 1), "rows": rows, "samples": seen,
                  "seconds": seconds, "samples_per_s": seen / seconds}
        if labels is not None:
            record["accuracy"] = correct / max(rows, 1)
        history.append(record)
        print(f"epoch {epoch}: loss {record['loss']:.4f} over {rows} samples"
              + (f", train accuracy {record['accuracy']:.3f}" if labels is not None else "")
              + f", {record['samples_per_s']:,.0f} samples/s", flush=True)
        if args.max_steps and step >= args.max_steps:
            break

    result = {"out": str(args.out), "device": str(device), "amp": amp, "objective": objective,
              "modalities": modalities, "classes": classes, "epochs": history}
    if args.metrics:
        args.metrics.write_text(json.dumps(result, indent=1))
    if args.save:
        torch.save({"model": model.state_dict(), "dims": dims, "fuse": fuse, "classes": classes,
                    "hidden": args.hidden, "embed_dim": args.embed_dim}, args.save)
    return result


if __name__ == "__main__":
    main()
