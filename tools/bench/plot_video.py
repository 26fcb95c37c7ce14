"""The video benchmark's plot for docs/benchmarks.md, from the $OUT/video_bench.json that
tools/bench/video_throughput.py writes on the GPU machine:

  .venv/bin/python tools/bench/plot_video.py video_bench.json docs/video_throughput.png

(needs matplotlib: `.venv/bin/pip install matplotlib`). One group of bars per sampling: each
measured decoder's clips/s over the whole process and over the run alone, and the issue's
target as a line.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGETS = {"fps1": 100, "nf4": 200}  # clips/s, whole process (issue 10)
LABELS = {"fps1": "1 frame per second (10 a clip)", "nf4": "4 frames a clip"}


def main() -> None:
    rows = json.load(open(sys.argv[1]))
    samplings = [s for s in ("fps1", "nf4") if any(r["sampling"] == s for r in rows)]
    fig, axes = plt.subplots(1, len(samplings), figsize=(5.5 * len(samplings), 4.2), sharey=True)
    axes = axes if len(samplings) > 1 else [axes]
    for ax, sampling in zip(axes, samplings):
        here = [r for r in rows if r["sampling"] == sampling]
        names = [r["who"].replace(" (cuda:0)", "") for r in here]
        x = range(len(here))
        ax.bar([i - 0.2 for i in x], [r["whole_clips_per_s"] for r in here], 0.4,
               label="whole process")
        ax.bar([i + 0.2 for i in x], [r["run_clips_per_s"] for r in here], 0.4,
               label="run only")
        ax.axhline(TARGETS[sampling], color="red", linestyle="--", linewidth=1,
                   label=f"target {TARGETS[sampling]} (whole process)")
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_title(f"{LABELS[sampling]}, 800 clips, median of 3", fontsize=10)
        ax.set_ylabel("clips/s")
        ax.legend(fontsize=8)
    fig.suptitle("720p30 H.264, ResNet-50 fp16, one H200 + 16 cores", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
