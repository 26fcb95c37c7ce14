#!/usr/bin/env python3
"""Peak host memory (RSS) of `precompute run` for 400, 2,000 and 8,000 samples, side by side, to
show that memory in flight is bounded and does not grow with the dataset.

    .venv/bin/python tools/bench/host_memory.py [--build build] [--work /tmp/precompute-rss]

The dataset is the demo's clips (video with speech audio and captions), listed again and again
under distinct ids; the run uses the demo's encoders (the real all-MiniLM-L6-v2 for text).
Prints one line per size and the growth per sample between the two largest sizes (past the
start, where caches and the in-flight bound fill up); exits 1 above --max-bytes-per-sample
(default 4,096). A band such as "within 10%" would hide a leak: over a ~700 MB base, 10% of 2,000
samples is 35 KB a sample. What legitimately grows with the dataset is the input held in memory
(ids, paths and captions) and the index (per shard): 1.5 KB a sample measured (docs/
benchmarks.md). Peaks vary by a few MB from run to run, about 1 KB a sample over 6,000 samples.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  runs precompute and reads its summary (same folder)


def run(cmd, **kwargs):
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, default=ROOT / "build")
    parser.add_argument("--work", type=Path, default=Path("/tmp/precompute-rss"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[400, 2000, 8000])
    parser.add_argument("--max-bytes-per-sample", type=float, default=4096)
    args = parser.parse_args()
    python = sys.executable
    models = ROOT / "build" / "demo" / "models"
    data = ROOT / "build" / "demo" / "data"
    if not (models / "all-MiniLM-L6-v2" / "config.json").exists():
        run([python, str(ROOT / "tools/scripts/export_encoders.py"), "demo", str(models)])
    run([python, str(ROOT / "tools/scripts/make_demo_dataset.py"), str(data)],
        stdout=subprocess.DEVNULL)
    base = [json.loads(line) for line in (data / "manifest.jsonl").read_text().splitlines()]
    base = [s for s in base if s["id"].startswith("clip")]

    args.work.mkdir(parents=True, exist_ok=True)
    peaks = {}
    for n in args.sizes:
        manifest = args.work / f"manifest-{n}.jsonl"
        with open(manifest, "w") as f:
            for i in range(n):
                s = dict(base[i % len(base)])
                s["id"] = f"{s['id']}-{i:06d}"
                s["video"] = str(data / s["video"])
                f.write(json.dumps(s) + "\n")
        out = args.work / f"out-{n}"
        result = precompute_run.run_precompute(
            args.build / "tools/cli/precompute", ROOT / "configs/demo.yaml", args.work / f"run-{n}",
            "--input", manifest, "--output", out, "--overwrite", "--shard-size", "256",
            "--progress-interval", "0")
        peaks[n] = result.peak_rss_mb
        print(f"{n:>6} samples: peak RSS {peaks[n]:.0f} MB, {result.per_s:.1f} samples/s")
    sizes = sorted(peaks)
    a, b = sizes[-2], sizes[-1]
    per_sample = (peaks[b] - peaks[a]) * 1e6 / (b - a)
    ok = per_sample <= args.max_bytes_per_sample
    print(f"peak RSS growth from {a} to {b} samples: {per_sample:,.0f} bytes per sample "
          f"({'within' if ok else 'OVER'} the limit of {args.max_bytes_per_sample:,.0f}); "
          f"{peaks[b] / peaks[sizes[0]]:.3f}x from {sizes[0]} to {b}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
