"""Issue 10's text figures: 1,000,000 short captions on one GPU and on two, against the strongest
Python peer (the tuned transformers loop of text_throughput.py), each figure the median of --runs
runs, whole process and run only, with where precompute's time went.

    python3 tools/bench/text_scale.py --build build-gpu --devices "cuda:0;cuda:0,cuda:1"
    .venv/bin/python tools/bench/text_scale.py --device-kind cpu --captions 2000 --runs 1 \
        --devices cpu --build build                       # smoke test on CPU

Data and model: text_throughput.py's (random 20,000-word vocabulary, random BERT-base, captions
of N(12, 5) words; with --model xlmr its XLM-R base and captions in 11 scripts), so the figures
compare with its table. precompute runs `encoder: {type: bert}`, bf16 (float32 on CPU), batches
of 4,096 captions / 65,536 tokens, float16 shards of 8,192, with `run.device` set to each device
set in turn. The peer runs in its own process per run (its whole-process figure includes Python,
torch and the model load, as precompute's includes its start-up), on the first device of the
first set.

Profile of each precompute run: its summary's busy seconds per stage (route, assemble, build
shards, commit, encode), and each GPU's mean utilisation from nvidia-smi sampled every 100 ms
while the process ran.

Each precompute run's start-up timeline, from its summary's `start_up`: the seconds from the
process's start to the end of each start-up step, and to the process's end (in the JSON as
"timeline"; printed with --log-level debug).

Writes $OUT/text_scale.json and prints a table.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  runs precompute and reads its summary
from text_throughput import GpuMemorySampler, make_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


PEER = r'''
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import torch
from transformers import AutoTokenizer
from text_throughput import embed_loop, load_bert
model_dir, manifest, device = sys.argv[2], sys.argv[3], sys.argv[4]
texts = [json.loads(l)["text"] for l in open(manifest)]
gpu = device.startswith("cuda")
if gpu:
    torch.backends.cuda.matmul.allow_tf32 = True
tok = AutoTokenizer.from_pretrained(model_dir)
model = load_bert(model_dir, device, torch.bfloat16 if gpu else torch.float32)
embed_loop(model, tok, texts[:4096], device, 65536, 256)
if gpu:
    torch.cuda.synchronize()
t = time.perf_counter()
emb = embed_loop(model, tok, texts, device, 65536, 256).to(torch.float16).cpu()
run_s = time.perf_counter() - t
print(json.dumps({"run_s": run_s, "n": emb.shape[0], "ready_s": t - t0}))
'''


def child_cpu_seconds(before: os.times_result) -> float:
    """CPU seconds (user + system) of the child processes waited for since `before`."""
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system
                                                            - before.children_system)


def time_precompute(binary: Path, model_dir: Path, manifest: Path, work: Path, devices: list,
                    dtype: str, tag: str, run_options: dict, log_level: str = "info",
                    gpu_sampler: bool = True, model: str = "bert") -> dict:
    """One precompute run (work/TAG.yaml, .log, .summary.json): wall clock, its own timer, load
    time, busy seconds per stage and peak RSS from its summary, CPU seconds, GPU utilisation."""
    out = work / f"out-{tag}"
    # Every timed run is a first run: an earlier call's output in the same place would make
    # this one remove it (--overwrite), inside its clock.
    shutil.rmtree(out, ignore_errors=True)
    cfg = {"input": {"manifest": str(manifest)},
           "output": {"path": str(out), "dtype": "float16", "shard_size": 8192,
                      "overwrite": True},
           "run": {"progress_interval_s": 0, "device": devices} | run_options,
           "text": {"encoder": {"type": "bert", "path": str(model_dir)}, "dtype": dtype,
                    "batch_size": 4096, "max_batch_tokens": 65536, "pooling": "mean",
                    "tokenizer": {"max_length": 256}}}
    if model == "bert":   # an XLM-R folder's tokenizer is its tokenizer.json
        cfg["text"]["tokenizer"]["vocab"] = str(model_dir / "vocab.txt")
    sampler = (GpuMemorySampler(utilisation=True)
               if gpu_sampler and any(d.startswith("cuda") for d in devices)
               and GpuMemorySampler.available() else None)
    if sampler:
        sampler.start()
    try:
        run = precompute_run.run_precompute(binary, cfg, work / tag, "--log-level", log_level,
                                            timeout=900)
    finally:
        if sampler:
            sampler.stop()
    got = {"n": run.samples, "whole_s": run.wall_s, "run_s": run.run_s, "load_s": run.load_s,
           "busy": run.busy, "cpu_s": run.cpu_s,
           "gpu_util_mean": sampler.utilisation_means() if sampler else {},
           "peak_rss_mb": run.peak_rss_mb, "timeline": run.timeline()}
    if log_level in ("debug", "trace"):
        for at, what in got["timeline"]:
            print(f"  {tag} {at:7.3f} s  {what}", flush=True)
    return got


def run_peer(model_dir: Path, manifest: Path, device: str) -> dict:
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", PEER, str(Path(__file__).resolve().parent),
                        str(model_dir), str(manifest), device], capture_output=True, text=True,
                       timeout=1800)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"tuned loop: exit {r.returncode}: {r.stderr[-2000:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return {"n": got["n"], "whole_s": wall, "run_s": got["run_s"], "ready_s": got["ready_s"]}


def summarise(who: str, runs: list) -> dict:
    row = {"who": who, "n": runs[0]["n"], "runs": len(runs),
           "whole_per_s": round(statistics.median(r["n"] / r["whole_s"] for r in runs)),
           "run_per_s": round(statistics.median(r["n"] / r["run_s"] for r in runs)),
           "each": runs}
    print(json.dumps({k: v for k, v in row.items() if k != "each"}
                     | {"last_busy": runs[-1].get("busy"),
                        "last_gpu_util": runs[-1].get("gpu_util_mean")}), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", type=int, default=1_000_000)
    ap.add_argument("--model", choices=["bert", "xlmr"], default="bert",
                    help="text_throughput.py's: BERT-base, or XLM-R base on captions in 11 "
                         "scripts (needs --xlmr-tokenizer)")
    ap.add_argument("--xlmr-tokenizer", type=Path, default=ROOT / "bench-data" / "xlmr-tokenizer",
                    help="--model xlmr: the folder tools/scripts/xlmr_test_folders.py "
                         "--bench-data wrote")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--devices", default="cuda:0;cuda:0,cuda:1",
                    help="device sets separated by ';', each a comma-separated list")
    ap.add_argument("--device-kind", default="cuda", help="cuda, or cpu for a smoke test")
    ap.add_argument("--build", type=Path, default=ROOT / "build-gpu")
    ap.add_argument("--binary", type=Path, action="append", default=[],
                    help="precompute binary (default: --build's); given more than once, the "
                         "binaries take turns run by run, each with its own median")
    ap.add_argument("--work", type=Path, default=Path("/tmp/text-scale"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--peer-runs", type=int, default=None, help="default: --runs; 0: no peer")
    ap.add_argument("--run-option", action="append", default=[], metavar="KEY=JSON",
                    help="a key of precompute's run section, e.g. max_in_flight=65536")
    ap.add_argument("--no-gpu-sampler", action="store_true",
                    help="time precompute without nvidia-smi polling utilisation and memory beside "
                         "it (three nvidia-smi loops at 100 ms; the peer's runs never have them)")
    ap.add_argument("--log-level", default="info",
                    help="precompute's; debug logs each text batch's timeline (its log: "
                         "--work/<devices>-<run>.log)")
    args = ap.parse_args()
    binaries = args.binary or [args.build / "tools" / "cli" / "precompute"]
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    data = make_data(args.work, args.captions, 1, 0, 256, args.model, args.xlmr_tokenizer)
    model_dir, manifest = data["paths"]["model_dir"], data["paths"]["short"]
    gpu = args.device_kind.startswith("cuda")
    dtype = "bfloat16" if gpu else "float32"
    sets = [s.split(",") for s in args.devices.split(";") if s]
    run_options = {kv.split("=", 1)[0]: json.loads(kv.split("=", 1)[1]) for kv in args.run_option}
    label = "".join(f", {k}={v}" for k, v in run_options.items())
    results, failed = [], 0
    peer_runs = args.runs if args.peer_runs is None else args.peer_runs
    if peer_runs > 0:
        try:
            results.append(summarise(f"tuned transformers loop ({sets[0][0]})",
                                     [run_peer(model_dir, manifest, sets[0][0])
                                      for _ in range(peer_runs)]))
        except Exception as e:  # the table says what failed; precompute still runs
            failed += 1
            print(json.dumps({"who": "tuned loop", "error": str(e)[-1500:]}), flush=True)
    for devices in sets:
        name = ",".join(devices)
        runs = {b: [] for b in range(len(binaries))}
        try:
            # Run by run in turn, so that a drift of the machine falls on every binary alike.
            for k in range(args.runs):
                for b, binary in enumerate(binaries):
                    suffix = f"-b{b}" if len(binaries) > 1 else ""
                    runs[b].append(time_precompute(
                        binary, model_dir, manifest, args.work, devices, dtype,
                        f"{name.replace(':', '').replace(',', '+')}{suffix}-{k}", run_options,
                        args.log_level, gpu_sampler=not args.no_gpu_sampler,
                        model=args.model))
            for b, binary in enumerate(binaries):
                which = f", {binary}" if len(binaries) > 1 else ""
                results.append(summarise(f"precompute ({name}{label}{which})", runs[b]))
        except Exception as e:
            failed += 1
            print(json.dumps({"who": f"precompute ({name})", "error": str(e)[-1500:]}), flush=True)
    (args.out / "text_scale.json").write_text(json.dumps(
        {"captions": args.captions, "cpus": os.cpu_count(), "results": results}, indent=1))
    width = max([52] + [len(r["who"]) for r in results])
    print(f"\n{'who':{width}} {'runs':>4} {'whole /s':>10} {'run /s':>10}")
    for r in results:
        print(f"{r['who']:{width}} {r['runs']:>4} {r['whole_per_s']:>10,} {r['run_per_s']:>10,}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
