"""NVDEC against the CPU decoders, end to end through `precompute run` (needs a CUDA GPU).

For each clip of tools/bench/make_video_clips.sh's `parity` set, precompute runs with
video.decoder: cpu, nvdec and auto, and:
1. pixels: a TorchScript model that returns its input (mean 0, std 1: the [0, 1] pixels, frames
   layout, pooling none) stores every sampled frame; NVDEC's frames must match the CPU's within a
   mean absolute difference of 0.02 per clip, with the same timestamps;
2. fallback: the 4:4:4 H.264 clip, which NVDEC cannot decode, must still be embedded, counted as
   a fallback in the summary, with frames bit-identical to the CPU's;
3. embeddings: a ResNet-18 (random weights, fixed seed, mean pooled) must give cosine >= 0.999
   between the two decoders for every clip, while different clips stay below that (so the
   measure can fail).
Prints one JSON line per check and exits 1 when any fails. Usage (the binary's libraries on
LD_LIBRARY_PATH, h5py importable):

  python3 tests/gpu/nvdec_parity.py --binary build-gpu/tools/cli/precompute \
      --clips bench-data/parity --work /tmp/nvdec-parity
"""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

MAX_MEAN_ABS_DIFF = 0.02
MIN_COSINE = 0.999
FALLBACK_CLIP = "h264_444"


class Pixels(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def export_models(work: Path) -> None:
    torch.jit.trace(Pixels(), torch.rand(2, 3, 224, 224)).save(str(work / "pixels.pt"))
    import torchvision
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    net.fc = torch.nn.Identity()
    net.eval()
    torch.jit.trace(net, torch.randn(2, 3, 224, 224)).save(str(work / "resnet18.pt"))


def run(binary: Path, work: Path, name: str, clips: list, model: str, decoder: str,
        pooling: str, normalise: bool, log_level: str = "info") -> dict:
    out = work / name
    manifest = work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": c.stem, "video": str(c)}) + "\n"
                                for c in clips))
    mean, std = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) if normalise else ([0] * 3, [1] * 3)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "dtype": "float32", "overwrite": True},
        "run": {"device": "cuda"},
        "video": {"encoder": {"path": str(work / model)}, "sampling": {"num_frames": 4},
                  "size": 224, "mean": mean, "std": std, "pooling": pooling,
                  "dtype": "float32", "decoder": decoder, "nvdec_sessions": 2},
    }
    config_path = work / f"{name}.yaml"
    config_path.write_text(json.dumps(config))
    r = subprocess.run([str(binary), "run", "--config", str(config_path), "--progress-interval",
                        "0", "--log-level", log_level], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: exit {r.returncode}\n{r.stderr[-3000:]}")
    summary = [ln for ln in r.stderr.splitlines() if "done:" in ln]
    result = {"summary": summary[-1] if summary else "", "samples": {}, "log": r.stderr}
    for shard in json.loads((out / "index.json").read_text())["shards"]:
        with h5py.File(out / shard["file"], "r") as f:
            g = f["video"]
            for i, sample_id in enumerate(f["ids"].asstr()[:]):
                if not g["present"][i]:
                    continue
                if g.attrs["layout"] == "pooled":
                    result["samples"][sample_id] = {"vector": g["embeddings"][i].astype(np.float64)}
                else:
                    lo, hi = g["offsets"][i], g["offsets"][i + 1]
                    result["samples"][sample_id] = {
                        "rows": g["values"][lo:hi].astype(np.float64),
                        "timestamps": g["timestamps"][lo:hi] if "timestamps" in g else None}
    return result


def number(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--clips", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    clips = sorted(p.resolve() for p in args.clips.iterdir()
                   if p.suffix in (".mp4", ".webm", ".mkv"))
    assert clips, f"no clips in {args.clips}: run tools/bench/make_video_clips.sh parity"
    export_models(args.work)
    failed = 0

    def check(name: str, ok: bool, **details) -> None:
        nonlocal failed
        failed += not ok
        print(json.dumps({"check": name, "ok": bool(ok), **details}), flush=True)

    runs = {d: run(args.binary, args.work, f"pixels_{d}", clips, "pixels.pt", d, "none", False,
                   "debug" if d == "nvdec" else "info")
            for d in ("cpu", "nvdec", "auto")}
    for d in ("nvdec", "auto"):
        check(f"{d}: summary", True, summary=runs[d]["summary"])
    # Note [Sessions left to the process's exit]: the CLI's run leaves its 2 sessions open.
    ends = [ln.split("] ")[-1] for ln in runs["nvdec"]["log"].splitlines()
            if "end:" in ln and "NVDEC session(s)" in ln]
    check("nvdec: the run leaves its sessions to the process's exit",
          ends == ["end: 2 NVDEC session(s) left to the process's exit"], end_lines=ends)
    on_nvdec = number(r"(\d+) clip\(s\) on NVDEC", runs["nvdec"]["summary"])
    fallbacks = number(r"(\d+) more given to NVDEC fell back", runs["nvdec"]["summary"])
    check("nvdec: every clip on NVDEC but the 4:4:4 one, which falls back",
          on_nvdec == len(clips) - 1 and fallbacks == 1, on_nvdec=on_nvdec, fallbacks=fallbacks)
    for d in ("nvdec", "auto"):
        for clip in clips:
            a = runs["cpu"]["samples"].get(clip.stem)
            b = runs[d]["samples"].get(clip.stem)
            if a is None or b is None:
                check(f"{d}: {clip.stem} embedded by both", False, cpu=a is not None, gpu=b is not None)
                continue
            same_shape = a["rows"].shape == b["rows"].shape
            diff = np.abs(a["rows"] - b["rows"]) if same_shape else None
            mean_diff = float(diff.mean()) if same_shape else None
            same_times = same_shape and np.array_equal(a["timestamps"], b["timestamps"])
            if clip.stem == FALLBACK_CLIP:
                ok = same_shape and same_times and float(diff.max()) == 0.0
            else:
                ok = same_shape and same_times and mean_diff <= MAX_MEAN_ABS_DIFF
            check(f"{d}: {clip.stem} pixels", ok, frames=int(a["rows"].shape[0]),
                  mean_abs_diff=mean_diff, max_abs_diff=float(diff.max()) if same_shape else None,
                  same_timestamps=bool(same_times))

    emb = {d: run(args.binary, args.work, f"resnet_{d}", clips, "resnet18.pt", d, "mean", True)
           for d in ("cpu", "nvdec")}
    worst = 1.0
    for clip in clips:
        a = emb["cpu"]["samples"][clip.stem]["vector"]
        b = emb["nvdec"]["samples"][clip.stem]["vector"]
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        worst = min(worst, cos)
        check(f"embedding cosine {clip.stem}", cos >= MIN_COSINE, cosine=round(cos, 6))
    vectors = [emb["cpu"]["samples"][c.stem]["vector"] for c in clips]
    cross = max(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))
                for i, u in enumerate(vectors) for v in vectors[i + 1:])
    check("different clips stay apart (the cosine measure can fail)", cross < worst,
          highest_cross_clip_cosine=round(cross, 6), lowest_same_clip_cosine=round(worst, 6))
    print(json.dumps({"nvdec_parity": "FAILED" if failed else "passed", "failed_checks": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
