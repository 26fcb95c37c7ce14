"""The video benchmark's plot for docs/benchmarks.md, from the video_bench.json files that
tools/bench/video_throughput.py writes on the GPU machine, one row of panels per clip set:

  .venv/bin/python tools/bench/plot_video.py docs/video_throughput.png \
      "720p30 H.264, 10-s clips, 800=docs/data/video_bench_2026-11-30c.json" \
      "1080p HEVC, 60-s clips, 24=docs/data/video_bench_hevc1080p_2026-12-01.json" ...

Each set is "TITLE=JSON" (needs matplotlib: `.venv/bin/pip install matplotlib`). One panel per
sampling: each measured row's clips/s over the whole process and over the run alone; on the
720p H.264 set (the issue's targets are for it) the target as a line.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGETS = {"fps1": 100, "nf4": 200}  # clips/s, whole process, 720p H.264 (issue 10)
LABELS = {"fps1": "1 frame per second", "nf4": "4 frames a clip"}


def short(who: str) -> str:
    return (who.replace(" (cuda:0)", "").replace("precompute ", "precompute\n")
            .replace("PyNvVideoCodec 8 threads", "PyNvVideoCodec\n8 threads")
            .replace(" [build-gpu-baseline]", "\n(the build before)").replace(" [build-gpu]", ""))


def main() -> None:
    out, sets = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    fig, axes = plt.subplots(len(sets), 2, figsize=(12, 3.6 * len(sets)), squeeze=False)
    for row, (title, path) in enumerate(sets):
        rows = json.load(open(path))
        for col, sampling in enumerate(("fps1", "nf4")):
            ax = axes[row][col]
            here = [r for r in rows if r["sampling"] == sampling]
            x = range(len(here))
            ax.bar([i - 0.2 for i in x], [r["whole_clips_per_s"] for r in here], 0.4,
                   label="whole process")
            ax.bar([i + 0.2 for i in x], [r["run_clips_per_s"] for r in here], 0.4,
                   label="run only")
            if "720p30 H.264" in title:
                ax.axhline(TARGETS[sampling], color="red", linestyle="--", linewidth=1,
                           label=f"target {TARGETS[sampling]} (whole process)")
            ax.set_xticks(list(x))
            ax.set_xticklabels([short(r["who"]) for r in here], fontsize=7)
            ax.set_title(f"{title}: {LABELS[sampling]}, median of 3", fontsize=9)
            ax.set_ylabel("clips/s")
            ax.legend(fontsize=7)
    fig.suptitle("ResNet-50 fp16 at 224x224, one H200 + 16 cores", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
