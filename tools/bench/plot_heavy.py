"""The per-frame encoders' plot for docs/benchmarks.md, from the heavy_MODEL_SAMPLING.json files
that tools/bench/run_gpu_heavy_bench.sh writes on the GPU machine, one panel per case:

  .venv/bin/python tools/bench/plot_heavy.py docs/heavy_encoders.png "TITLE" \
      docs/data/heavy_resnet50_fps1.json docs/data/heavy_vit_l_16_fps4.json ...

Each measured row's clips/s over the whole process and over the run alone; the model alone and
PyNvVideoCodec decoding only as lines (the encoder's and the decoder's bounds), and the goal where
the case has one (needs matplotlib: `.venv/bin/pip install matplotlib`).
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Run clips/s the issue asks for, per (model, sampling).
GOALS = {("resnet50", "fps1"): 100, ("vit_b_16", "fps1"): 100, ("vit_l_16", "fps4"): 50}
NAMES = {"resnet50": "ResNet-50", "vit_b_16": "ViT-B/16", "vit_l_16": "ViT-L/16"}


def short(who: str) -> str:
    return (who.replace(" (cuda:0)", "").replace("precompute ", "precompute\n")
            .replace("PyNvVideoCodec 8 threads, ", "PyNvVideoCodec\n")
            .replace("batches of 256", "model, 256 a batch"))


def frames_per_clip(rows: list) -> float:
    """Frames embedded a clip, from a precompute run of the case."""
    for row in rows:
        for run in row.get("each", []):
            if run.get("frames_embedded") and run.get("clips"):
                return run["frames_embedded"] / run["clips"]
    raise ValueError("no precompute run says how many frames a clip it embedded")


def main() -> None:
    out, title, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    fig, axes = plt.subplots(1, len(paths), figsize=(4.8 * len(paths), 4.2), squeeze=False)
    for ax, path in zip(axes[0], paths):
        rows = json.loads(Path(path).read_text())
        measured = [r for r in rows if "run_clips_per_s" in r]
        model = measured[0]["model"]
        sampling = measured[0]["sampling"]
        bars = [r for r in measured if "decode only" not in r["who"]]
        x = range(len(bars))
        ax.bar([i - 0.2 for i in x], [r["whole_clips_per_s"] for r in bars], 0.4,
               label="whole process")
        ax.bar([i + 0.2 for i in x], [r["run_clips_per_s"] for r in bars], 0.4, label="run only")
        for r in rows:
            if "img_per_s" in r:
                bound = r["img_per_s"] / frames_per_clip(measured)
                ax.axhline(bound, color="grey", linestyle=":", linewidth=1,
                           label=f"model alone {bound:.1f}")
            elif "decode only" in r["who"]:
                ax.axhline(r["run_clips_per_s"], color="purple", linestyle="-.", linewidth=1,
                           label=f"PyNvVideoCodec decoding only {r['run_clips_per_s']:.1f}")
        if (model, sampling) in GOALS:
            goal = GOALS[(model, sampling)]
            ax.axhline(goal, color="red", linestyle="--", linewidth=1, label=f"goal {goal} (run)")
        ax.set_xticks(list(x))
        ax.set_xticklabels([short(r["who"]) for r in bars], fontsize=7)
        ax.set_title(f"{NAMES.get(model, model)}, {sampling.replace('fps', '')} frame(s)/s, "
                     f"median of {bars[0]['runs']}", fontsize=9)
        ax.set_ylabel("clips/s")
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main()
