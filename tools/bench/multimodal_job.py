"""One full job with all three modalities: precompute against its Python equivalent, same clips,
same three models, same device, same run (tools/bench/run_gpu_media_bench.sh runs it on the GPU
machine; `--quick` is a small CPU smoke run).

Workload (issue 10): --samples entries cycling over the clips of --clips (720p30 H.264 with AAC,
tools/bench/make_video_clips.sh h264_720p; distinct ids), each with a random caption. Per sample:
- video: 1 frame per second (frames at k + 0.5 s), shorter side to 224 and centre crop,
  ImageNet normalisation, torchvision ResNet-50 (random weights, seed 0, traced; --resnet),
  frames mean-pooled; fp16 on a GPU, fp32 on the CPU;
- audio: the clip's own track, whole (window_s 0), mono 16 kHz, the small conv encoder of
  tools/bench/audio_throughput.py, fp32;
- text: a random-init BERT folder (BERT-base on the GPU; a 2-layer one with --quick) with a
  20,000-word vocabulary as tools/bench/text_throughput.py builds, mean pooling, bf16 on a GPU.
precompute writes its HDF5 shards (float16).

The peer (what a user would write today; the GPU machine has no torchaudio and no FFmpeg CLI):
torchcodec 0.17 on the CPU in --workers DataLoader workers (VideoDecoder.get_frames_played_at at
the same times, resized and cropped in the worker with torch's antialiased bilinear; AudioDecoder
at 16 kHz mono), batches of --batch samples, the same three models on the same device (BERT via
transformers with its fast tokenizer), and h5py writing ids and the three [N, D] float16 arrays.

Figures, each the median of --runs runs: samples/s over the whole process (start to exit) and over
the run alone (precompute's own timer; the peer's loop), peak host RSS of the process tree
(polled from /proc, DataLoader workers included). Parity: cosine per sample and modality,
precompute against the peer, reported (the resize filters differ: libswscale's against torch's,
so video is not expected to match exactly).

Writes $OUT/multimodal_job.json and $OUT/multimodal_job.md. Exit 1 when a measurement failed.
"""
import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audio_throughput import (SAMPLE_RATE, cosines, export_audio_model, peer_env,  # noqa: E402
                              read_shards, run_process, time_precompute, write_manifest)
import precompute_run  # noqa: E402  runs precompute, reads its summary, writes table rows
import text_throughput as tt  # noqa: E402

import statistics  # noqa: E402


def export_resnet(path: Path, arch: str) -> Path:
    if path.exists():
        return path
    import torch
    from torch import nn
    torch.manual_seed(0)
    try:
        import torchvision
        m = getattr(torchvision.models, arch)()
        m.fc = nn.Identity()
    except ImportError:  # the development machine's venv has no torchvision (--quick only)
        print(f"no torchvision: a small ResNet-like stand-in for {arch}", flush=True)
        m = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.MaxPool2d(3, 2, 1), nn.Conv2d(32, 64, 3, 2, 1), nn.BatchNorm2d(64),
                          nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten())
    m.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.trace(m, torch.randn(2, 3, 224, 224)).save(str(path))
    return path


def make_bert(folder: Path, layers: int, hidden: int, seed: int, n: int) -> list:
    """A random BERT folder (safetensors, vocab.txt, fast tokenizer) and n captions."""
    rng = random.Random(seed)
    words = set()
    while len(words) < 20000:
        words.add("".join(rng.choice(tt.LETTERS) for _ in range(rng.randint(2, 9))))
    words = sorted(words)
    captions = [" ".join(rng.choices(words, k=max(3, int(rng.gauss(12, 5))))) for _ in range(n)]
    stamp = folder / "stamp.json"
    params = {"layers": layers, "hidden": hidden, "seed": seed}
    if not (stamp.exists() and json.loads(stamp.read_text()) == params):
        import torch
        from transformers import BertConfig, BertModel
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        (folder / "vocab.txt").write_text("\n".join(tt.SPECIALS + words) + "\n")
        torch.manual_seed(seed)
        cfg = BertConfig(vocab_size=len(words) + len(tt.SPECIALS), num_hidden_layers=layers,
                         hidden_size=hidden, num_attention_heads=max(2, hidden // 64),
                         intermediate_size=4 * hidden)
        BertModel(cfg).save_pretrained(folder, safe_serialization=True)
        tt.make_tokenizer(folder / "vocab.txt", 128).save_pretrained(folder)
        stamp.write_text(json.dumps(params))
    return captions


PEER = r'''
import json, sys, time
T0 = time.perf_counter()
import h5py, numpy as np, torch, torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchcodec.decoders import AudioDecoder, VideoDecoder
from transformers import AutoTokenizer, BertModel
manifest, r50, audio_pt, bert_dir, device, workers, batch, out, vdtype, tdtype = sys.argv[1:11]
workers, batch = int(workers), int(batch)
vdtype, tdtype = getattr(torch, vdtype), getattr(torch, tdtype)
rows = [json.loads(l) for l in open(manifest)]

class Samples(Dataset):
    def __len__(self):
        return len(rows)
    def __getitem__(self, i):
        r = rows[i]
        d = VideoDecoder(r["video"], dimension_order="NCHW")
        dur = d.metadata.duration_seconds
        times = [k + 0.5 for k in range(max(1, int(dur + 0.5)))]
        times = [t for t in times if t < dur] or [dur / 2]
        x = d.get_frames_played_at(seconds=times).data.float()
        h, w = x.shape[-2:]
        s = 224 / min(h, w)
        nh, nw = max(224, round(h * s)), max(224, round(w * s))
        x = F.interpolate(x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)
        top, left = (nh - 224) // 2, (nw - 224) // 2
        x = x[:, :, top:top + 224, left:left + 224].clamp(0, 255).round().to(torch.uint8)
        a = AudioDecoder(r["video"], sample_rate=16000, num_channels=1).get_all_samples()
        return i, x.contiguous(), a.data[0].contiguous(), r["text"]

def one_thread(_):
    torch.set_num_threads(1)

video = torch.jit.load(r50, map_location=device).eval().to(vdtype)
audio = torch.jit.load(audio_pt, map_location=device).eval()
tok = AutoTokenizer.from_pretrained(bert_dir)
bert = BertModel.from_pretrained(bert_dir, dtype=tdtype, attn_implementation="sdpa")
bert = bert.to(device).eval()
mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
with torch.inference_mode():
    video(torch.zeros(2, 3, 224, 224, device=device, dtype=vdtype))
    audio(torch.zeros(1, 16000, device=device), torch.full((1,), 16000, device=device))
    bert(**tok(["warm up"], return_tensors="pt").to(device))
if device.startswith("cuda"):
    torch.cuda.synchronize()
loader = DataLoader(Samples(), batch_size=batch, num_workers=workers, collate_fn=list,
                    worker_init_fn=one_thread if workers else None)
n = len(rows)
f = h5py.File(out, "w")
ids = f.create_dataset("ids", (n,), dtype=h5py.string_dtype())
sets = {}
done = 0
t = time.perf_counter()
with torch.inference_mode():
    for items in loader:
        idx = [it[0] for it in items]
        frames = torch.cat([it[1] for it in items]).to(device, non_blocking=True)
        counts = [it[1].shape[0] for it in items]
        y = video(((frames.float() - mean) / std).to(vdtype)).float()
        v = torch.stack([p.mean(0) for p in torch.split(y, counts)])
        a = [None] * len(items)
        groups = {}
        for k, it in enumerate(items):
            groups.setdefault(it[2].numel(), []).append(k)
        for length, ks in groups.items():
            x = torch.stack([items[k][2] for k in ks]).to(device, non_blocking=True)
            z = audio(x, torch.full((len(ks),), length, dtype=torch.long, device=device)).float()
            for j, k in enumerate(ks):
                a[k] = z[j]
        a = torch.stack(a)
        enc = tok([it[3] for it in items], padding=True, truncation=True, max_length=128,
                  return_tensors="pt").to(device)
        hdn = bert(**enc).last_hidden_state.float()
        m = enc["attention_mask"].unsqueeze(-1).float()
        t_ = (hdn * m).sum(1) / m.sum(1)
        for name, val in (("video", v), ("audio", a), ("text", t_)):
            val = val.cpu().numpy().astype(np.float16)
            if name not in sets:
                sets[name] = f.create_dataset(f"{name}/embeddings", (n, val.shape[1]), "f2",
                                              chunks=(min(256, n), val.shape[1]))
            sets[name][idx[0]:idx[-1] + 1] = val
        ids[idx[0]:idx[-1] + 1] = [rows[i]["id"] for i in idx]
        done += len(items)
f.close()
run_s = time.perf_counter() - t
try:
    from torchcodec._core import get_ffmpeg_library_versions
    ffmpeg = get_ffmpeg_library_versions().get("ffmpeg_version")
except Exception:
    ffmpeg = None
print(json.dumps({"run_s": run_s, "samples": done, "start_s": t - T0, "ffmpeg": ffmpeg}))
'''


def read_peer(path: Path) -> dict:
    import h5py
    out = {}
    with h5py.File(path) as f:
        ids = f["ids"].asstr()[:]
        for m in ("video", "audio", "text"):
            e = f[f"{m}/embeddings"][:]
            out[m] = dict(zip(ids, e))
    return out


def summarise(who: str, runs: list) -> dict:
    n = runs[0]["n"]
    return {"who": who, "samples": n, "runs": len(runs),
            "whole_samples_per_s": round(statistics.median(n / r["whole_s"] for r in runs), 2),
            "run_samples_per_s": round(statistics.median(n / r["run_s"] for r in runs), 2),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "each": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=Path("build/tools/cli/precompute"))
    ap.add_argument("--clips", type=Path, default=Path("bench-data/h264_720p"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/multimodal-job"))
    ap.add_argument("--samples", type=int, default=320)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=32, help="samples per peer batch; precompute's "
                    "video batch_size (audio 16, text 1024 on a GPU)")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--resnet", default="resnet50")
    ap.add_argument("--bert-layers", type=int, default=12)
    ap.add_argument("--bert-hidden", type=int, default=768)
    ap.add_argument("--peer-path", default=os.environ.get("PEER_PYTHONPATH", ""),
                    help="PYTHONPATH entry holding torchcodec (for the peer only)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke run: 2 s clips made here with the ffmpeg CLI, 6 samples, "
                         "resnet18, a 2-layer BERT, 1 run")
    args = ap.parse_args(argv)
    if args.quick:
        args.device, args.samples, args.runs, args.workers, args.batch = "cpu", 6, 1, 2, 4
        args.resnet, args.bert_layers, args.bert_hidden = "resnet18", 2, 128
        args.clips = args.work / "clips-quick"
        args.clips.mkdir(parents=True, exist_ok=True)
        for i in range(2):
            path = args.clips / f"q{i}.mp4"
            if not path.exists():
                import subprocess
                subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                                f"testsrc2=size=320x240:rate=30:duration={2 + i}", "-f", "lavfi",
                                "-i", f"sine=frequency={300 + 200 * i}:sample_rate=44100:"
                                f"duration={2 + i}", "-ac", "2", "-c:v", "libx264", "-pix_fmt",
                                "yuv420p", "-g", "30", "-c:a", "aac", "-b:a", "64k", "-shortest",
                                str(path)], check=True)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = args.device.startswith("cuda")
    vdtype, tdtype = ("float16", "bfloat16") if gpu else ("float32", "float32")
    r50 = export_resnet(args.work / f"{args.resnet}.pt", args.resnet)
    audio_pt = export_audio_model(args.work / "audio_conv.pt")
    bert_dir = args.work / f"bert-{args.bert_layers}x{args.bert_hidden}"
    captions = make_bert(bert_dir, args.bert_layers, args.bert_hidden, 0, args.samples)
    clips = sorted(p.resolve() for p in args.clips.iterdir() if p.suffix in (".mp4", ".mkv"))
    assert clips, f"no clips in {args.clips}"
    rows = [{"id": f"s{i:06d}", "video": str(clips[i % len(clips)]), "text": captions[i]}
            for i in range(args.samples)]
    manifest = args.work / "manifest.jsonl"
    write_manifest(manifest, rows)
    print(json.dumps({"samples": len(rows), "clips": len(clips), "device": args.device,
                      "resnet": args.resnet, "bert": [args.bert_layers, args.bert_hidden]}),
          flush=True)

    out = args.work / "out-precompute"
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "overwrite": True, "dtype": "float16"},
        "run": {"device": [args.device]},
        "video": {"encoder": {"path": str(r50)}, "dtype": vdtype, "size": 224,
                  "sampling": {"fps": 1}, "pooling": "mean", "batch_size": 64},
        "audio": {"encoder": {"path": str(audio_pt)}, "dtype": "float32", "batch_size": 16,
                  "sample_rate": SAMPLE_RATE, "window_s": 0, "pooling": "mean"},
        "text": {"encoder": {"type": "bert", "path": str(bert_dir)}, "dtype": tdtype,
                 "batch_size": 1024 if gpu else 32, "pooling": "mean", "normalize": False,
                 "tokenizer": {"max_length": 128}},
    }
    results, failed, vectors = [], 0, {}
    try:
        runs = [time_precompute(args.binary, config, args.work, f"precompute-{k}", args.timeout)
                for k in range(args.runs)]
        results.append(summarise(f"precompute ({args.device})", runs))
        vectors["precompute"] = {m: read_shards(out, m) for m in ("video", "audio", "text")}
    except Exception as e:
        failed += 1
        print(json.dumps({"who": "precompute", "error": str(e)[-1500:]}), flush=True)
    if not args.no_peer:
        script = args.work / "peer_job.py"
        script.write_text(PEER)
        try:
            runs = []
            for k in range(args.runs):
                h5 = args.work / "peer.h5"
                wall, stdout, _, peak = run_process(
                    [sys.executable, str(script), str(manifest), str(r50), str(audio_pt),
                     str(bert_dir), args.device, str(args.workers), str(args.batch), str(h5),
                     vdtype, tdtype], peer_env(args.peer_path), args.work / f"peer-{k}.log",
                    args.timeout)
                got = json.loads(stdout.strip().splitlines()[-1])
                runs.append({"n": len(rows), "whole_s": wall, "run_s": got["run_s"],
                             "peak_rss_mib": round(peak / 2**20), "ffmpeg": got.get("ffmpeg")})
            results.append(summarise(f"torchcodec CPU decode + {args.workers} DataLoader "
                                     f"workers + h5py ({args.device}, batch {args.batch})", runs))
            vectors["peer"] = read_peer(h5)
        except Exception as e:
            failed += 1
            print(json.dumps({"who": "peer", "error": str(e)[-1500:]}), flush=True)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "each"}), flush=True)
    parity = None
    if "precompute" in vectors and "peer" in vectors:
        parity = {m: cosines(vectors["precompute"][m], vectors["peer"][m])
                  for m in ("video", "audio", "text")}
        print(json.dumps({"parity": parity}), flush=True)
        if any(p["compared"] != len(rows) for p in parity.values()):
            failed += 1
    report = {"workload": {"samples": len(rows), "clips": len(clips), "device": args.device,
                           "resnet": args.resnet, "bert": [args.bert_layers, args.bert_hidden],
                           "video_dtype": vdtype, "text_dtype": tdtype, "batch": args.batch,
                           "workers": args.workers, "runs": args.runs, "quick": args.quick},
              "results": results, "parity": parity, "failed": failed}
    (args.out / "multimodal_job.json").write_text(json.dumps(report, indent=1))
    md = ["| who | runs | whole samples/s | run samples/s | peak RSS MiB |",
          "|---|---:|---:|---:|---:|"]
    md += [precompute_run.table_row([r["who"], r["runs"], r["whole_samples_per_s"],
                                     r["run_samples_per_s"], r["peak_rss_mib"]])
           for r in results]
    if parity:
        md.append("\nParity (cosine per sample, precompute vs peer): " + "; ".join(
            f"{m} min {p['min']} median {p['median']}" for m, p in parity.items()))
    (args.out / "multimodal_job.md").write_text("\n".join(md) + "\n")
    print("\n" + "\n".join(md))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
