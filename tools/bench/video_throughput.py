"""Video throughput on the GPU machine: precompute in each decoder mode against NVIDIA's
PyNvVideoCodec, same clips, same model, same run (tools/bench/run_gpu_video_bench.sh runs it).

Workload (the issue's): every clip of --clips repeated --copies times (8 x 100 = 800 clips),
sampled at 1 frame per second (fps1; fpsN: N frames a second) or 4 frames spread over the clip
(nf4), each frame resized to 224x224 and normalised, ResNet-50 (--model: or ViT-B/16, ViT-L/16;
random weights, fp16, torchvision's, TorchScript) on one GPU, frames mean-pooled per clip.
precompute writes its HDF5 shards; the peer keeps its vectors in memory (it does less).

Figures, each the median of --runs runs: clips/s over the whole process (start to exit: loading,
CUDA start-up and writing included) and over the run alone (precompute's own timer, from its
summary; the peer's loop). Also precompute's decoded frames per clip and where its clips were
decoded.

The peer: PyNvVideoCodec 2.2 (NVDEC through NVIDIA's own bindings), one SimpleDecoder per thread
reused across files (reconfigure_decoder), --peer-threads threads, frames fetched by index in one
batch per clip, as RGB planar in device memory; resized on the GPU (bilinear, antialiased) and
embedded by the same model in fp16, a forward pass a clip or (--peer-batch) batched across
clips, as a heavy encoder needs. It is the strongest peer measured on this machine. --alone
times the model alone on random batches: the encoder's bound.

Prints one JSON line per measurement and a table; writes $OUT/video_bench.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import precompute_run  # runs precompute and reads its summary (same folder)
from text_scale import child_cpu_seconds

WORK = Path("/tmp/video-bench")


MODELS = ("resnet50", "vit_b_16", "vit_l_16")  # torchvision's, per frame at 224x224


def export_model(work: Path = WORK, name: str = "resnet50") -> Path:
    """A torchvision model (MODELS) with random weights and no classifier, traced, in `work`
    (made once)."""
    path = work / ("r50.pt" if name == "resnet50" else f"{name}.pt")
    if not path.exists():
        import torch
        import torchvision
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)()
        if name == "resnet50":
            m.fc = torch.nn.Identity()
        else:
            m.heads = torch.nn.Identity()
        m.eval()
        with torch.no_grad():
            torch.jit.trace(m, torch.randn(2, 3, 224, 224)).save(str(path))
    return path


def sampling_section(sampling: str) -> dict:
    """video.sampling for a sampling name: fpsN (N frames a second) or nf4 (4 frames a clip)."""
    if sampling.startswith("fps"):
        return {"fps": float(sampling[3:])}
    assert sampling == "nf4", f"sampling {sampling} is fpsN or nf4"
    return {"num_frames": 4}


def clip_list(clips: Path, copies: int) -> list:
    files = sorted(p for p in clips.iterdir() if p.suffix in (".mp4", ".mkv", ".webm"))
    assert files, f"no clips in {clips}"
    return [f for _ in range(copies) for f in files]


def time_precompute(binary: Path, model: Path, files: list, sampling: str, decoder: str,
                    sessions: int, devices: list, tag: str, video_extra: dict,
                    log_level: str = "info", decode_threads: int = 0,
                    max_in_flight: int = 0, work: Optional[Path] = None) -> dict:
    """One precompute run (WORK/TAG.yaml, .log, .summary.json; `work` instead of WORK when
    given): wall clock, its own timer, CPU seconds, and from its summary where the clips were
    decoded and how busy the decoders kept while the graph ran (Note [How busy the decoders
    were])."""
    work = work or WORK
    manifest = work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"c{i:06d}", "video": str(f)}) + "\n"
                                for i, f in enumerate(files)))
    out = work / f"out-{tag}"
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "overwrite": True},
        "run": {"device": devices, "decode_threads": decode_threads,
                "max_in_flight": max_in_flight},
        "video": {"encoder": {"path": str(model)}, "dtype": "float16", "size": 224,
                  "sampling": sampling_section(sampling),
                  "pooling": "mean", "decoder": decoder, "nvdec_sessions": sessions,
                  "batch_size": 64} | video_extra,
    }
    run = precompute_run.run_precompute(binary, config, work / tag, "--progress-interval", "0",
                                        "--log-level", log_level, timeout=900)
    video = run.summary["video_decoding"]
    busy_fraction = video["nvdec_busy_fraction"]
    # The encoder's time in use (the union of its calls) and the rate it kept while in use,
    # which compares with --alone (Note [An encoder's time in use] in
    # pipeline/core/overlap_clock.cpp).
    in_use = run.busy.get("video encoder in use")
    at_once = video["cpu_decodes_at_once"]
    # Each start-up step's end, in seconds from the process's start.
    got_timeline = {"timeline": run.timeline()}
    if log_level in ("debug", "trace"):
        for at, what in got_timeline["timeline"]:
            print(f"  {tag} {at:7.3f} s  {what}", flush=True)
    return got_timeline | {"clips": run.samples, "whole_s": run.wall_s, "run_s": run.run_s,
            "decoded_per_clip": round(video["frames_decoded"] / video["clips"], 1)
            if video["clips"] else None,
            "on_nvdec": video["clips_on_nvdec"],
            "handed_over": video["nvdec_handovers"], "summary": run.done_line(),
            "decoders": video["decoders"] if video["nvdec_sessions"] > 0 else None,
            "busy": run.busy,
            "graph_s": run.summary["seconds"]["graph"],
            "frames_embedded": video["frames_kept"],
            "encoder_in_use_s": in_use,
            "encoder_img_per_s": round(video["frames_kept"] / in_use, 1) if in_use else None,
            "gpu_peak_mib": run.gpu_peak_mib(),
            "gpu_budget_mib": (run.summary["memory"]["gpu_budget"] or [{}])[0].get(
                "budget_bytes", 0) / 2**20,
            "nvdec_busy_pct": round(100 * busy_fraction) if busy_fraction is not None else None,
            "cpu_decodes_at_once": round(at_once, 1) if at_once is not None else None,
            # CPU seconds of the process (user + system): what a clip costs the cores.
            "cpu_s": run.cpu_s}


PEER = r'''
import json, queue, sys, threading, time, concurrent.futures as cf
import torch, torch.nn.functional as F
import PyNvVideoCodec as nvc
model, listing, sampling, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
decode_only = sys.argv[5] == "decode-only"
batch = int(sys.argv[6])  # frames a forward pass across clips; 0: one pass a clip
files = open(listing).read().split("\n")[:-1]
if not decode_only:
    net = torch.jit.load(model).cuda().half().eval()
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    with torch.inference_mode():
        net(torch.randn(32, 3, 224, 224, device="cuda").half())
torch.cuda.synchronize()
local = threading.local()

def times(duration):
    if sampling.startswith("fps"):
        per_s = float(sampling[3:])
        return [(k + 0.5) / per_s for k in range(max(1, int(duration * per_s)))]
    return [(k + 0.5) * duration / 4 for k in range(4)]

def one(path):
    if not hasattr(local, "decoder"):
        local.decoder = nvc.SimpleDecoder(path, gpu_id=0, use_device_memory=True,
                                          output_color_type=nvc.OutputColorType.RGBP)
    else:
        local.decoder.reconfigure_decoder(path)
    d = local.decoder
    n = len(d)
    meta = d.get_stream_metadata()
    fps = getattr(meta, "average_fps", None) or getattr(meta, "avg_frame_rate", None) or 30.0
    index = [min(n - 1, int(t * fps)) for t in times(n / fps)]
    frames = d.get_batch_frames_by_index(index)
    x = torch.stack([torch.from_dlpack(f) for f in frames])
    if x.shape[-1] == 3:
        x = x.permute(0, 3, 1, 2)
    if decode_only:  # the frames decoded, as RGB in device memory: what decode_bench measures
        torch.cuda.synchronize()
        return x.shape[0]
    with torch.inference_mode():
        x = F.interpolate(x.float(), size=(224, 224), mode="bilinear", antialias=True)
        x = ((x - mean) / std).half()
        if batch:
            pending.put(x)
        else:
            net(x).mean(0).float().cpu()
    return x.shape[0]

# With --peer-batch the decode threads queue their clips' frames and one thread runs the model
# on batches of that many frames across clips, each clip's rows pooled and copied back.
pending = queue.Queue(maxsize=64)
def encode_across_clips():
    held, count = [], 0
    with torch.inference_mode():
        while True:
            x = pending.get()
            if x is not None:
                held.append(x)
                count += x.shape[0]
            if held and (count >= batch or x is None):
                rows = torch.cat([net(b) for b in torch.cat(held).split(batch)])
                for clip_rows in rows.split([h.shape[0] for h in held]):
                    clip_rows.mean(0).float().cpu()
                held, count = [], 0
            if x is None:
                return

encoder = threading.Thread(target=encode_across_clips) if batch else None
t = time.perf_counter()
if encoder:
    encoder.start()
with cf.ThreadPoolExecutor(threads) as ex:
    frames = sum(ex.map(one, files))
if encoder:
    pending.put(None)
    encoder.join()
torch.cuda.synchronize()
print(json.dumps({"run_s": time.perf_counter() - t, "frames": frames}))
'''

# The model alone on random batches in device memory: the encoder's own bound.
ALONE = r'''
import json, sys, time
import torch
net = torch.jit.load(sys.argv[1]).cuda().half().eval()
batch, passes = int(sys.argv[2]), 40
x = torch.randn(batch, 3, 224, 224, device="cuda").half()
with torch.inference_mode():
    for _ in range(3):
        net(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(passes):
        net(x)
    torch.cuda.synchronize()
print(json.dumps({"img_per_s": passes * batch / (time.perf_counter() - t), "batch": batch}))
'''


def run_peer(model: Path, files: list, sampling: str, threads: int,
             decode_only: bool = False, batch: int = 0) -> dict:
    listing = WORK / "peer-files.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    script = WORK / "peer_pynvc.py"
    script.write_text(PEER)
    before = os.times()
    t = time.perf_counter()
    r = subprocess.run([sys.executable, str(script), str(model), str(listing), sampling,
                        str(threads), "decode-only" if decode_only else "model", str(batch)],
                       capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    cpu_s = child_cpu_seconds(before)
    if r.returncode != 0:
        raise RuntimeError(f"PyNvVideoCodec: exit {r.returncode}: {r.stderr[-2000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return {"clips": len(files), "whole_s": wall, "run_s": got["run_s"], "frames": got["frames"],
            "cpu_s": cpu_s}


def at_least_zero(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; 0 turns it off")
    return value


def model_alone(model: Path, batch: int) -> float:
    """Images a second of the model alone on random batches of `batch` in device memory."""
    script = WORK / "model_alone.py"
    script.write_text(ALONE)
    r = subprocess.run([sys.executable, str(script), str(model), str(batch)],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"the model alone: exit {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["img_per_s"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, action="append", required=True,
                    help="precompute; give it twice (a baseline build, then this one) to run "
                         "both in turn, case by case and run by run")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--clips", type=Path, default=Path("bench-data/h264_720p"))
    ap.add_argument("--copies", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samplings", default="fps1,nf4")
    ap.add_argument("--modes", default="auto,nvdec,cpu",
                    help="video.decoder values; MODE@N also sets video.nvdec_sessions to N "
                         "(e.g. 'auto,auto@4': the default against 4 sessions, run by run), "
                         "MODE#T run.decode_threads to T (e.g. 'auto,auto#19', 'auto@4#12'), "
                         "MODE%%F run.max_in_flight to F (e.g. 'auto,auto%%1000'), "
                         "MODE+KEY=JSON a video key for that case alone, after --video-json "
                         "(e.g. 'auto,auto+nvdec_own_context=false')")
    ap.add_argument("--sessions", type=int, default=0,
                    help="video.nvdec_sessions where a mode gives none (0: two per engine)")
    ap.add_argument("--devices", default="cuda:0",
                    help="device sets separated by ';' (each measured), each a comma-separated "
                         "list, e.g. 'cuda:0;cuda:0,cuda:1'")
    ap.add_argument("--peer-threads", type=int, default=8)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--peer-decode-only", action="store_true",
                    help="the peer decodes the sampled frames to RGB on the GPU and stops there "
                         "(no resize, no model): to compare with decode_bench's NVDEC alone")
    ap.add_argument("--peer-decode-bound", action="store_true",
                    help="the peer with the model, and also decoding only: the decode bound "
                         "beside the loop, both --runs times")
    ap.add_argument("--json", default="video_bench.json", help="the results' file name in --out")
    ap.add_argument("--model", choices=MODELS, default="resnet50",
                    help="torchvision's, random weights, per frame (the peer runs the same)")
    ap.add_argument("--peer-batch", type=at_least_zero, default=0,
                    help="frames a forward pass in the peer, batched across clips (0: one pass "
                         "a clip); 256 is the heavy-encoder loop")
    ap.add_argument("--alone", type=at_least_zero, default=0, metavar="BATCH",
                    help="also time the model alone on random batches of BATCH frames, --runs "
                         "times: the encoder's bound")
    ap.add_argument("--log-level", default="info", help="precompute's (debug: time per file)")
    ap.add_argument("--video-json", default="{}", help="more video keys, e.g. '{\"seek\": false}'")
    ap.add_argument("--one-run-modes", default="nvdec,cpu",
                    help="modes measured once (the others --runs times)")
    args = ap.parse_args()
    # The wrapper gives build-gpu's binary first; naming it again adds no case.
    firsts = {}
    for binary in args.binary:
        firsts.setdefault(binary.resolve(), binary)
    args.binary = list(firsts.values())
    WORK.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model = export_model(name=args.model)
    files = clip_list(args.clips.resolve(), args.copies)
    device_sets = [s.split(",") for s in args.devices.split(";") if s]
    one_run = set(args.one_run_modes.split(",")) if args.one_run_modes else set()
    results = []
    failed = 0

    def record(who: str, sampling: str, runs: list) -> None:
        row = {"who": who, "model": args.model, "sampling": sampling, "clips": runs[0]["clips"],
               "runs": len(runs),
               "whole_clips_per_s": round(statistics.median(r["clips"] / r["whole_s"]
                                                            for r in runs), 2),
               "run_clips_per_s": round(statistics.median(r["clips"] / r["run_s"]
                                                          for r in runs), 2),
               "cpu_ms_per_clip": round(1000 * statistics.median(r["cpu_s"] / r["clips"]
                                                                  for r in runs), 1)
               if "cpu_s" in runs[0] else None,
               # The rate the encoder kept while in use (precompute's rows), for --alone.
               "encoder_img_per_s": statistics.median(r["encoder_img_per_s"] for r in runs)
               if all(r.get("encoder_img_per_s") for r in runs) else None,
               "each": runs}
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "each"} |
                         {"extra": {k: runs[-1].get(k) for k in ("decoded_per_clip", "on_nvdec",
                                                                  "handed_over", "decoders",
                                                                  "frames", "graph_s",
                                                                  "nvdec_busy_pct",
                                                                  "encoder_in_use_s",
                                                                  "encoder_img_per_s",
                                                                  "cpu_decodes_at_once")}}),
              flush=True)

    if args.alone:
        rates = [model_alone(model, args.alone) for _ in range(args.runs)]
        row = {"who": f"{args.model} alone, batches of {args.alone}", "runs": len(rates),
               "img_per_s": round(statistics.median(rates), 1),
               "each": [round(r, 1) for r in rates]}
        results.append(row)
        print(json.dumps(row), flush=True)

    for sampling in args.samplings.split(","):
        peer_kinds = [] if args.no_peer else (
            [False, True] if args.peer_decode_bound else [args.peer_decode_only])
        for decode_only in peer_kinds:
            try:
                record(f"PyNvVideoCodec {args.peer_threads} threads"
                       + (", decode only" if decode_only else "")
                       + (f", batches of {args.peer_batch}"
                          if args.peer_batch and not decode_only else ""), sampling,
                       [run_peer(model, files, sampling, args.peer_threads, decode_only,
                                 args.peer_batch)
                        for _ in range(args.runs)])
            except Exception as e:  # the table says what failed; the rest still runs
                failed += 1
                print(json.dumps({"who": "PyNvVideoCodec", "sampling": sampling,
                                  "error": str(e)[-1500:]}), flush=True)
        # Each (mode, devices) is measured run by run in turn with the others, so that a drift
        # of the machine during the call weighs on all of them alike.
        cases = []
        for spec in args.modes.split(",") if args.modes else []:
            spec, *settings = spec.split("+")
            video_keys = {}
            for setting in settings:
                key, sep, value = setting.partition("=")
                if not key or not sep:
                    ap.error(f"--modes: '{setting}' is not KEY=JSON")
                try:
                    video_keys[key] = json.loads(value)
                except ValueError:
                    ap.error(f"--modes: '{value}' in '{setting}' is not JSON (true, 2, \"text\")")
            spec, _, in_flight = spec.partition("%")
            spec, _, threads = spec.partition("#")
            mode, _, given = spec.partition("@")
            sessions = int(given) if given else args.sessions
            decode_threads = int(threads) if threads else 0
            max_in_flight = int(in_flight) if in_flight else 0
            for devices in device_sets:
                for b, binary in enumerate(args.binary):
                    # build-gpu-baseline/tools/cli/precompute -> "build-gpu-baseline"
                    build = f" [{binary.resolve().parents[2].name}]" if len(args.binary) > 1 else ""
                    label = (f"precompute {mode}" + (f", {sessions} sessions" if given else "") +
                             (f", {decode_threads} decode threads" if threads else "") +
                             (f", {max_in_flight} in flight" if in_flight else "") +
                             "".join(f", {k}={json.dumps(v)}" for k, v in video_keys.items()) +
                             f" ({','.join(devices)}){build}")
                    cases.append({"label": label, "mode": mode, "sessions": sessions,
                                  "devices": devices, "n": 1 if mode in one_run else args.runs,
                                  "decode_threads": decode_threads,
                                  "max_in_flight": max_in_flight,
                                  "video_keys": video_keys,
                                  "binary": binary, "runs": [], "error": None,
                                  "tag": f"{mode}{given}t{threads}f{in_flight}"
                                         f"k{len(cases)}-{sampling}-{len(devices)}gpu-b{b}"})
        for k in range(max([c["n"] for c in cases], default=0)):
            for c in cases:
                if k >= c["n"] or c["error"]:
                    continue
                try:
                    c["runs"].append(time_precompute(c["binary"], model, files, sampling,
                                                     c["mode"], c["sessions"], c["devices"],
                                                     f"{c['tag']}-{k}",
                                                     json.loads(args.video_json)
                                                     | c["video_keys"],
                                                     args.log_level, c["decode_threads"],
                                                     c["max_in_flight"]))
                except Exception as e:
                    c["error"] = str(e)[-1500:]
        for c in cases:
            if c["error"]:
                failed += 1
                print(json.dumps({"who": c["label"], "sampling": sampling,
                                  "error": c["error"]}), flush=True)
            else:
                record(c["label"], sampling, c["runs"])

    # The encoder in the pipeline against the model alone (issue's goal: at least 90%).
    alone = next((r["img_per_s"] for r in results if "img_per_s" in r), None)
    for r in results:
        if alone and r.get("encoder_img_per_s"):
            r["encoder_of_alone_pct"] = round(100 * r["encoder_img_per_s"] / alone, 1)
    (args.out / args.json).write_text(json.dumps(results, indent=1))
    print(f"\n{'who':44} {'sampling':8} {'runs':>4} {'whole clips/s':>14} {'run clips/s':>12} "
          f"{'CPU ms/clip':>12} {'encoder img/s in use (% alone)':>31}")
    for r in results:
        if "img_per_s" in r:
            print(f"{r['who']:44} {r['img_per_s']} img/s")
            continue
        encoder = (f"{r['encoder_img_per_s']:.0f} ({r.get('encoder_of_alone_pct', '-')}%)"
                   if r.get("encoder_img_per_s") else "-")
        print(f"{r['who']:44} {r['sampling']:8} {r['runs']:>4} {r['whole_clips_per_s']:>14} "
              f"{r['run_clips_per_s']:>12} {r.get('cpu_ms_per_clip') or '-':>12} {encoder:>31}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
