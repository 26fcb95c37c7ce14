"""CLIP vision towers per frame on the GPU machine: precompute with a `.pt2` package and with
TorchScript against NVIDIA's PyNvVideoCodec feeding the same Hugging Face model in a Python loop,
same clips, same run (tools/bench/run_gpu_clip_bench.sh runs it).

Workload: every clip of --clips repeated --copies times (8 x 100 = 800 clips of 10 s, 720p30
H.264), one frame a second, each frame resized as CLIP's processor does (shorter side to 224,
centre crop 224x224, CLIP's mean and std), a CLIP vision tower (transformers' CLIPVisionModel
with random weights, seed 0, ViT-B/16 or ViT-L/14 sizes) in float16 on one GPU, its
pooler_output stored per frame (video.pooling none).

The cases, run by run in turn so that a drift of the machine weighs on all alike:
- precompute, `.pt2`: `python -m precompute.export clip-vision FOLDER --device cuda --dtype
  float16`, the config naming only the package (size, mean, std and resize come from it);
- precompute, TorchScript: the same module traced, the preprocessing stated in the config;
- the peer: PyNvVideoCodec 2.2 decodes the sampled frames into device memory (--peer-threads
  threads, one decoder each, reused across files), each clip's frames are resized on the GPU
  (bicubic, antialiased, shorter side then centre crop) and normalised, and frames are batched
  across clips into forward passes of 256 in float16 under inference_mode; eager, and with
  --peer-compile also torch.compile'd (one run; the faster of the two is the peer);
- the bounds: the model alone on random batches of 256 (eager; compiled too with
  --peer-compile), and precompute with a module that only averages each frame's pixels (decoding,
  resizing and writing, next to no model): the decode-bound figure of the same pipeline.

Figures, each the median of --runs runs: clips/s over the whole process (start to exit) and over
the run alone (precompute's own timer; the peer's loop), in-pipeline frames/s of the encoder
(frames / its busy seconds, which sum its concurrent calls: a lower bound), and the GPU memory
precompute reserved at its peak against its budget; and how far the `.pt2` run's stored frame
rows are from the TorchScript run's (cosine per row, each less its mean). Prints one JSON line
per measurement and a table; writes $OUT/clip_bench.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from text_scale import child_cpu_seconds  # noqa: E402
from video_throughput import clip_list, time_precompute  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORK = Path("/tmp/clip-bench")

# The published towers' sizes (openai/clip-vit-base-patch16, clip-vit-large-patch14).
MODELS = {
    "clip-b16": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                     num_attention_heads=12, patch_size=16, image_size=224),
    "clip-l14": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                     num_attention_heads=16, patch_size=14, image_size=224),
}
# What those folders' preprocessor_config.json say.
PROCESSOR = {"crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
             "size": {"shortest_edge": 224}, "resample": 3,
             "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711]}


def model_folder(name: str) -> Path:
    """A Hugging Face folder of the tower with random weights (made once)."""
    folder = WORK / name
    if not (folder / "config.json").exists():
        import torch
        from transformers import CLIPVisionConfig, CLIPVisionModel
        torch.manual_seed(0)
        CLIPVisionModel(CLIPVisionConfig(**MODELS[name])).eval().save_pretrained(folder)
        (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    return folder


def export_package(folder: Path, device: str, dtype: str) -> tuple:
    """(the `.pt2` package, seconds its export and compilation took; 0 when made before)."""
    out = folder.with_suffix(f".{device}.pt2")
    if out.exists():
        return out, 0.0
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "precompute.export", "clip-vision", str(folder),
                        str(out), "--device", device, "--dtype", dtype],
                       env={**os.environ, "PYTHONPATH": str(ROOT / "python")},
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"export of {folder}: exit {r.returncode}: {r.stderr[-2000:]}")
    return out, time.perf_counter() - t


def trace_torchscript(folder: Path, device: str, dtype: str) -> Path:
    """The recipe's module (pooler_output of frames [N, 3, 224, 224]) traced on `device` in
    `dtype`. Traced in float32, transformers' CLIP would cast every input to float32 (its
    embeddings cast to the weights' dtype, which the trace records as a constant) and fail
    against float16 weights: a TorchScript file is traced for the dtype it will run in."""
    out = folder.with_suffix(f".{device.split(':')[0]}.{dtype}.pt")
    if not out.exists():
        import torch
        from transformers import CLIPVisionModel
        sys.path.insert(0, str(ROOT / "python"))
        from precompute.export import _Pooled
        kind = getattr(torch, dtype)
        model = _Pooled(CLIPVisionModel.from_pretrained(folder, torch_dtype=kind),
                        "pooler_output").to(device).eval()
        with torch.no_grad():
            example = torch.randn(2, 3, 224, 224, device=device, dtype=kind)
            torch.jit.trace(model, example, strict=False).save(str(out))
    return out


def pixel_mean_module() -> Path:
    """A module that only averages each frame's pixels ([N, 3]): precompute's decode bound."""
    out = WORK / "pixel_mean.pt"
    if not out.exists():
        import torch

        class PixelMean(torch.nn.Module):
            def forward(self, frames: torch.Tensor) -> torch.Tensor:
                return frames.mean(dim=(2, 3))

        torch.jit.script(PixelMean()).save(str(out))
    return out


def stored_rows(out: Path) -> dict:
    """id -> the frame rows a precompute output holds for it (video.pooling none)."""
    import h5py
    import numpy as np
    rows = {}
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            values = f["video/values"][:].astype(np.float64)
            offsets = f["video/offsets"][:]
            for k, sample in enumerate(f["ids"].asstr()[:]):
                rows[sample] = values[offsets[k]:offsets[k + 1]]
    return rows


def row_parity(a: dict, b: dict) -> dict:
    """Cosine of each frame row of a against b's, both less their own mean row (random towers
    give rows that are alike across frames, which would let any output pass)."""
    import numpy as np
    x = np.concatenate([a[k] for k in sorted(a)])
    y = np.concatenate([b[k] for k in sorted(a)])
    x, y = x - x.mean(0), y - y.mean(0)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1) + 1e-30)
    return {"rows": int(x.shape[0]), "min_cos": round(float(cos.min()), 6),
            "median_cos": round(float(np.median(cos)), 6)}


PEER = r'''
import json, queue, sys, threading, time, concurrent.futures as cf
import torch, torch.nn.functional as F
from transformers import CLIPVisionModel
folder, listing, threads, mode, compiled = sys.argv[1:6]
threads, compiled, batch = int(threads), compiled == "1", 256
pre = json.load(open(folder + "/preprocessor_config.json"))
net = CLIPVisionModel.from_pretrained(folder, torch_dtype=torch.float16,
                                      attn_implementation="sdpa").cuda().eval()
forward = lambda x: net(pixel_values=x).pooler_output
if compiled:
    forward = torch.compile(forward, dynamic=True)
mean = torch.tensor(pre["image_mean"], device="cuda").view(1, 3, 1, 1) * 255
std = torch.tensor(pre["image_std"], device="cuda").view(1, 3, 1, 1) * 255
started = time.perf_counter()
with torch.inference_mode():
    for b in (batch, 37):
        forward(torch.randn(b, 3, 224, 224, device="cuda").half())
torch.cuda.synchronize()
warm_s = time.perf_counter() - started

if mode == "alone":
    x = torch.randn(batch, 3, 224, 224, device="cuda").half()
    with torch.inference_mode():
        t = time.perf_counter()
        for _ in range(30):
            forward(x)
        torch.cuda.synchronize()
    print(json.dumps({"img_per_s": 30 * batch / (time.perf_counter() - t), "warm_s": warm_s}))
    sys.exit(0)

import PyNvVideoCodec as nvc
files = open(listing).read().split("\n")[:-1]
local = threading.local()
ready = queue.Queue(maxsize=64)

def frames_of(path):
    if not hasattr(local, "decoder"):
        local.decoder = nvc.SimpleDecoder(path, gpu_id=0, use_device_memory=True,
                                          output_color_type=nvc.OutputColorType.RGBP)
    else:
        local.decoder.reconfigure_decoder(path)
    d = local.decoder
    n = len(d)
    meta = d.get_stream_metadata()
    fps = getattr(meta, "average_fps", None) or getattr(meta, "avg_frame_rate", None) or 30.0
    index = [min(n - 1, int((k + 0.5) * fps)) for k in range(max(1, int(n / fps)))]
    x = torch.stack([torch.from_dlpack(f) for f in d.get_batch_frames_by_index(index)])
    if x.shape[-1] == 3:
        x = x.permute(0, 3, 1, 2)
    h, w = x.shape[-2:]
    side = 224
    size = (side, max(side, round(w * side / h))) if h <= w else (max(side, round(h * side / w)), side)
    x = F.interpolate(x.float(), size=size, mode="bicubic", antialias=True)
    top, left = (x.shape[-2] - side) // 2, (x.shape[-1] - side) // 2
    x = x[..., top:top + side, left:left + side]
    ready.put(((x - mean) / std).half())
    return x.shape[0]

stored = []
def embed():
    pending, count = [], 0
    with torch.inference_mode():
        while True:
            item = ready.get()
            if item is not None:
                pending.append(item)
                count += item.shape[0]
            if count >= batch or (item is None and count):
                x = torch.cat(pending)
                for s in range(0, x.shape[0], batch):
                    stored.append(forward(x[s:s + batch]).float().cpu())
                pending, count = [], 0
            if item is None:
                torch.cuda.synchronize()
                return

t = time.perf_counter()
consumer = threading.Thread(target=embed)
consumer.start()
with cf.ThreadPoolExecutor(threads) as pool:
    frames = sum(pool.map(frames_of, files))
ready.put(None)
consumer.join()
run_s = time.perf_counter() - t
print(json.dumps({"run_s": run_s, "frames": frames, "embedded": sum(v.shape[0] for v in stored),
                  "warm_s": warm_s}))
'''


def run_peer(folder: Path, files: list, threads: int, mode: str, compiled: bool) -> dict:
    """One peer process: mode "loop" (the whole workload) or "alone" (the model on random
    batches); wall clock and CPU seconds measured from outside."""
    listing = WORK / "peer-files.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    script = WORK / "peer_clip.py"
    script.write_text(PEER)
    before = os.times()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(script), str(folder), str(listing), str(threads),
                        mode, "1" if compiled else "0"], capture_output=True, text=True,
                       timeout=900)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"peer ({mode}): exit {r.returncode}: {r.stderr[-2000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if mode == "alone":
        return got
    if got["embedded"] != got["frames"]:
        raise RuntimeError(f"peer embedded {got['embedded']} of {got['frames']} frames")
    return {"clips": len(files), "whole_s": wall, "run_s": got["run_s"], "frames": got["frames"],
            "cpu_s": child_cpu_seconds(before), "warm_s": got["warm_s"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, default=Path("build-gpu/tools/cli/precompute"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--clips", type=Path, default=Path("bench-data/h264_720p"))
    ap.add_argument("--copies", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="clip-b16,clip-l14")
    ap.add_argument("--peer-threads", type=int, default=8)
    ap.add_argument("--peer-compile", action="store_true",
                    help="also the peer and the model alone under torch.compile (one run)")
    ap.add_argument("--no-bound", action="store_true",
                    help="skip precompute's decode bound (the pixel-mean module)")
    ap.add_argument("--device", default="cuda:0",
                    help="cpu: a smoke run of precompute's cases in float32, without the peer "
                         "(PyNvVideoCodec needs NVDEC)")
    args = ap.parse_args()
    if args.runs < 1 or args.copies < 1:
        ap.error("--runs and --copies are 1 or more")
    WORK.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    files = clip_list(args.clips.resolve(), args.copies)
    on_gpu = args.device.startswith("cuda")
    dtype = "float16" if on_gpu else "float32"
    clip_keys = {"resize": "shorter_side_crop", "mean": PROCESSOR["image_mean"],
                 "std": PROCESSOR["image_std"]}
    rows, failed = [], 0
    started = time.perf_counter()

    def elapsed() -> str:
        return f"[{time.perf_counter() - started:.0f} s]"

    def record(model: str, who: str, runs: list, **extra) -> dict:
        row = {"model": model, "who": who, "clips": runs[0]["clips"], "runs": len(runs),
               "whole_clips_per_s": round(statistics.median(r["clips"] / r["whole_s"]
                                                            for r in runs), 2),
               "run_clips_per_s": round(statistics.median(r["clips"] / r["run_s"]
                                                          for r in runs), 2),
               "cpu_ms_per_clip": round(1000 * statistics.median(r["cpu_s"] / r["clips"]
                                                                  for r in runs), 1),
               **extra, "each": runs}
        rows.append(row)
        print(elapsed(), json.dumps({k: v for k, v in row.items() if k != "each"}), flush=True)
        return row

    def precompute_case(model: str, tag: str, encoder: Path, extra: dict) -> dict:
        got = time_precompute(args.binary, encoder, files, "fps1", "auto" if on_gpu else "cpu",
                              0, [args.device], tag, {"pooling": "none", "dtype": dtype} | extra,
                              work=WORK)
        encode_s = got["busy"].get("encode video")
        frames = got["frames_embedded"]
        got["encoder_frames_per_s"] = round(frames / encode_s, 1) if encode_s else None
        return got

    bound = None
    if not args.no_bound:
        try:
            module = pixel_mean_module()
            bound = record("-", "precompute, pixel mean (decode bound)",
                           [precompute_case("-", f"bound-{k}", module, clip_keys)
                            for k in range(args.runs)])
        except Exception as e:
            failed += 1
            print(elapsed(), json.dumps({"who": "decode bound", "error": str(e)[-1500:]}),
                  flush=True)

    for model in args.models.split(","):
        try:
            folder = model_folder(model)
            package, export_s = export_package(folder, args.device.split(":")[0], dtype)
            torchscript = trace_torchscript(folder, args.device, dtype)
            print(elapsed(), json.dumps({"model": model, "export_s": round(export_s, 1),
                                         "package_mb": round(package.stat().st_size / 1e6, 1)}),
                  flush=True)
            alone = {"eager": run_peer(folder, files, args.peer_threads, "alone", False)} \
                if on_gpu else {}
            if args.peer_compile and on_gpu:
                alone["compiled"] = run_peer(folder, files, args.peer_threads, "alone", True)
            print(elapsed(), json.dumps({"model": model, "alone": alone}), flush=True)
            cases = {"precompute .pt2": [], "precompute TorchScript": [],
                     "PyNvVideoCodec + transformers, eager": []}
            if not on_gpu:
                del cases["PyNvVideoCodec + transformers, eager"]
            for k in range(args.runs):
                if on_gpu:
                    cases["PyNvVideoCodec + transformers, eager"].append(
                        run_peer(folder, files, args.peer_threads, "loop", False))
                cases["precompute .pt2"].append(
                    precompute_case(model, f"{model}-pt2-{k}", package, {}))
                cases["precompute TorchScript"].append(
                    precompute_case(model, f"{model}-ts-{k}", torchscript, clip_keys))
            if args.peer_compile and on_gpu:
                cases["PyNvVideoCodec + transformers, torch.compile"] = [
                    run_peer(folder, files, args.peer_threads, "loop", True)]
            frames_per_clip = cases["precompute .pt2"][0]["frames_embedded"] / len(files)
            best_alone = max((a["img_per_s"] for a in alone.values()), default=0.0)
            for who, runs in cases.items():
                extra = {}
                if who.startswith("precompute"):
                    extra = {"encoder_frames_per_s": statistics.median(
                                 r["encoder_frames_per_s"] for r in runs),
                             "gpu_peak_reserved_mib": max((r["gpu_peak_mib"] or 0) for r in runs),
                             "gpu_budget_mib": runs[0]["gpu_budget_mib"]}
                record(model, who, runs, **extra)
            parity = row_parity(stored_rows(WORK / f"out-{model}-pt2-0"),
                                stored_rows(WORK / f"out-{model}-ts-0"))
            record_bounds = {"model": model, "who": "bounds", "pt2_vs_torchscript": parity,
                             "alone_img_per_s": {k: round(a["img_per_s"], 1)
                                                 for k, a in alone.items()},
                             "alone_clips_per_s": round(best_alone / frames_per_clip, 2),
                             "frames_per_clip": frames_per_clip,
                             "export_s": round(export_s, 1)}
            rows.append(record_bounds)
            print(elapsed(), json.dumps(record_bounds), flush=True)
        except Exception as e:
            failed += 1
            print(elapsed(), json.dumps({"model": model, "error": str(e)[-1500:]}), flush=True)

    (args.out / "clip_bench.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'model':9} {'who':44} {'runs':>4} {'whole clips/s':>14} {'run clips/s':>12} "
          f"{'CPU ms/clip':>12}")
    for r in rows:
        if "whole_clips_per_s" in r:
            print(f"{r['model']:9} {r['who']:44} {r['runs']:>4} {r['whole_clips_per_s']:>14} "
                  f"{r['run_clips_per_s']:>12} {r['cpu_ms_per_clip']:>12}")
    best = {}
    for r in rows:
        if "run_clips_per_s" in r and r["who"].startswith("PyNvVideoCodec"):
            key = r["model"]
            if key not in best or r["run_clips_per_s"] > best[key]["run_clips_per_s"]:
                best[key] = r
    for r in rows:
        if r.get("who") == "bounds":
            mine = next((x for x in rows if x.get("model") == r["model"]
                         and x.get("who") == "precompute .pt2"), None)
            peer = best.get(r["model"])
            if mine is None or peer is None:
                continue
            lower = min(r["alone_clips_per_s"], bound["run_clips_per_s"]) if bound else \
                r["alone_clips_per_s"]
            print(f"{r['model']}: .pt2 run {mine['run_clips_per_s']} clips/s = "
                  f"{mine['run_clips_per_s'] / peer['run_clips_per_s']:.2f}x the peer's run, "
                  f"{mine['whole_clips_per_s'] / peer['whole_clips_per_s']:.2f}x whole; "
                  f"{100 * mine['run_clips_per_s'] / lower:.0f}% of the lower bound {lower:.2f} "
                  f"(model alone {r['alone_clips_per_s']}, decode bound "
                  f"{bound['run_clips_per_s'] if bound else '-'})")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
