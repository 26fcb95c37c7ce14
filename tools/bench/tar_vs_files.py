"""WebDataset tar input against the same clips as files through a manifest: the clip set
(bench-data/h264_720p, COPIES times over) is packed into TARS tar shards (KEY.mp4 members, as
video2dataset writes them), and the same config runs on both inputs, RUNS times each, taking
turns. Prints per run and as medians: clips/s over the whole process and over the run alone, and
how long reading the input took before any work (the summary's start_up step "input checked":
for tars, every header read once; for the manifest, its lines parsed), with the tars' bytes
indexed per second. JSON lines in OUT/tar_vs_files.jsonl.

    python3 tools/bench/tar_vs_files.py --binary build-gpu/tools/cli/precompute \\
        --clips bench-data/h264_720p --copies 20 --tars 8 --runs 3
"""

import argparse
import json
import os
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402
from video_throughput import export_model  # noqa: E402  (the video benchmarks' model)


def input_seconds(run: precompute_run.Run) -> float:
    """Seconds from the end of the step before "input checked" to its end."""
    steps = run.summary.get("start_up", [])
    for k, step in enumerate(steps):
        if step["step"] == "input checked":
            return step["at_s"] - (steps[k - 1]["at_s"] if k > 0 else 0.0)
    raise RuntimeError("the summary has no 'input checked' step")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--clips", type=Path, default=Path("bench-data/h264_720p"))
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--tars", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/tar-vs-files"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)

    files = sorted(p.resolve() for p in args.clips.iterdir() if p.suffix == ".mp4")
    assert files, f"no .mp4 clips in {args.clips}"
    samples = [(f"c{i:06d}", f) for i, f in enumerate(f for _ in range(args.copies) for f in files)]
    manifest = args.work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": key, "video": str(f)}) + "\n"
                                for key, f in samples))
    shards = args.work / "shards"
    shards.mkdir(exist_ok=True)
    per_tar = (len(samples) + args.tars - 1) // args.tars
    tar_bytes = 0
    for t in range(args.tars):
        path = shards / f"{t:06d}.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
            for key, f in samples[t * per_tar:(t + 1) * per_tar]:
                tar.add(f, arcname=f"{key}.mp4")
        tar_bytes += path.stat().st_size
    pattern = str(shards / f"{{000000..{args.tars - 1:06d}}}.tar")
    model = export_model(args.work)
    print(f"tar_vs_files: {len(samples)} clips, {args.tars} tars of {tar_bytes / 1e6:.0f} MB in "
          f"all; pattern {pattern}", flush=True)

    inputs = {"files": {"manifest": str(manifest)}, "tars": {"tars": pattern}}
    results = {name: [] for name in inputs}
    log = open(args.out / "tar_vs_files.jsonl", "a")
    for k in range(args.runs):
        for name, section in inputs.items():
            config = {
                "input": section,
                "output": {"path": str(args.work / f"out-{name}"), "overwrite": True},
                "run": {"device": args.device},
                "video": {"encoder": {"path": str(model)}, "dtype": "float16", "size": 224,
                          "sampling": {"fps": 1.0}, "pooling": "mean", "decoder": "auto",
                          "batch_size": 64},
            }
            run = precompute_run.run_precompute(args.binary, config, args.work / f"{name}-{k}",
                                                "--progress-interval", "0", timeout=900)
            row = {"input": name, "run": k, "clips": run.samples,
                   "embedded": run.embedded("video"),
                   "whole_per_s": round(run.samples / run.wall_s, 2),
                   "run_per_s": round(run.per_s, 2), "whole_s": round(run.wall_s, 2),
                   "input_s": round(input_seconds(run), 4)}
            if name == "tars":
                row["index_gb_per_s"] = round(tar_bytes / 1e9 / max(row["input_s"], 1e-6), 2)
            results[name].append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), flush=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"\n| input | clips/s whole | clips/s run | input read (s) |")
    print("|---|---:|---:|---:|")
    for name in inputs:
        print(f"| {name} | {median(name, 'whole_per_s'):.2f} | {median(name, 'run_per_s'):.2f} | "
              f"{median(name, 'input_s'):.3f} |")
    ratio_whole = median("tars", "whole_per_s") / median("files", "whole_per_s")
    ratio_run = median("tars", "run_per_s") / median("files", "run_per_s")
    print(f"tars/files: whole {ratio_whole:.3f}, run {ratio_run:.3f}; tar index "
          f"{median('tars', 'index_gb_per_s'):.2f} GB/s of tar ({tar_bytes / 1e6:.0f} MB, "
          f"{len(samples)} members, page cache warm)")
    bad = [r for rs in results.values() for r in rs if r["embedded"] != len(samples)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
