"""The GPU memory budget shared by three encoders on one GPU (issue: broken promises, "the GPU
budget is split evenly over every concurrent encoder call"). An even split refused 1 GiB for
ResNet-50 + BERT-base + a small audio encoder: 6 calls of 646.8 MiB each under 4 GiB, and under
1 GiB less than the 164 MiB one ResNet-50 call needs, while the audio encoder needs almost nothing.
Shares now follow each encoder's measured need (Note [Shares by measured need] in
pipeline/memory_budget.cpp).

Runs on the GPU machine, after tools/bench/build_on_gpu.sh:
    python3 tools/bench/gpu_budget_split.py --build build-gpu --out $OUT

Exports a random-weight torchvision ResNet-50 (frames [N, 3, 224, 224] -> [N, 2048]) and a small
audio encoder to TorchScript, takes the text benchmark's random BERT-base folder
(tools/bench/text_throughput.py), and runs `precompute run` with all three on cuda:0 under
run.gpu_memory_budget 1 GiB, 2 GiB and 650 MiB over 64 samples, each a caption and one of the
benchmark clips for video and audio (bench-data/h264_720p, tools/bench/make_video_clips.sh): every
section needs an input on some line or the run is refused, and the calibration at start-up is
what is measured, so a short run is enough. Checks: 1 GiB and 2 GiB are accepted,
each encoder's share is logged, peak reserved stays within the budget; a budget below the sum of
one sample per call is refused (exit 2) listing every encoder's need. Writes
gpu_budget_split.json and .md under --out; exit 1 when a check fails.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  (runs precompute, reads its summary)
import text_throughput as tt  # noqa: E402


def log(msg: str) -> None:
    print(f"[gpu_budget_split {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def export_encoders(work: Path) -> dict:
    import torch
    import torchvision

    paths = {"video": work / "resnet50.pt", "audio": work / "audio_small.pt"}
    if not paths["video"].exists():
        model = torchvision.models.resnet50(weights=None)
        model.fc = torch.nn.Identity()
        model.eval()
        torch.jit.trace(model, torch.zeros(1, 3, 224, 224)).save(str(paths["video"]))

    class SmallAudio(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 64, kernel_size=400, stride=160)
            self.proj = torch.nn.Linear(64, 128)

        def forward(self, wave: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.conv(wave.unsqueeze(1)))
            return self.proj(x.mean(dim=2))

    if not paths["audio"].exists():
        torch.jit.script(SmallAudio().eval()).save(str(paths["audio"]))
    return paths


def config(paths: dict, model_dir: Path, manifest: Path, out: Path, budget: str) -> dict:
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "overwrite": True},
        "run": {"progress_interval_s": 0, "device": "cuda:0", "gpu_memory_budget": budget},
        "video": {"encoder": {"path": str(paths["video"])}, "sampling": {"num_frames": 16},
                  "size": 224, "batch_size": 8},
        "audio": {"encoder": {"path": str(paths["audio"])}, "sample_rate": 16000,
                  "window_s": 2.0, "batch_size": 64},
        "text": {"encoder": {"type": "bert", "path": str(model_dir)}, "dtype": "bfloat16",
                 "batch_size": 256, "tokenizer": {"max_length": 256}},
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build", type=Path, default=Path("build-gpu"))
    p.add_argument("--work", type=Path, default=Path("/tmp/text-bench"))
    p.add_argument("--out", type=Path, default=Path("/tmp/out"))
    p.add_argument("--clips", type=Path, default=Path("bench-data/h264_720p"),
                   help="folder of .mp4 clips with an audio track")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    binary = args.build / "tools/cli/precompute"
    data = tt.make_data(args.work, 1000, 100, seed=1234, max_length=256)
    paths = export_encoders(args.work)
    manifest = args.work / "split-captions.jsonl"
    texts = data["texts"]["long"][:64] if "texts" in data else None
    if texts is None:
        texts = [json.loads(line)["text"]
                 for line in data["paths"]["long"].read_text().splitlines()[:64]]
    clips = sorted(str(c.resolve()) for c in args.clips.glob("*.mp4"))
    if not clips:
        log(f"no .mp4 clips in {args.clips} (tools/bench/make_video_clips.sh h264_720p)")
        return 1
    manifest.write_text("".join(
        json.dumps({"id": f"t{i}", "text": t, "video": clips[i % len(clips)],
                    "audio": clips[i % len(clips)]}) + "\n"
        for i, t in enumerate(texts)))

    results, checks = {"runs": []}, []
    for budget, expect in [("1GiB", 0), ("2GiB", 0), ("650MiB", 2)]:
        cfg_path = args.work / f"split-{budget}.yaml"
        cfg_path.write_text(json.dumps(config(paths, data["paths"]["model_dir"], manifest,
                                              args.work / f"split-out-{budget}", budget)))
        try:
            # Its log and summary: OUT/split-BUDGET.log, .summary.json; a refusal (exit 2) is
            # a result here, judged by the checks below.
            r = precompute_run.run_precompute(binary, cfg_path, args.out / f"split-{budget}",
                                              timeout=300, ok=(0, 2))
        except precompute_run.PrecomputeFailed as e:
            r = e.run
        wall = r.wall_s
        shares = [(c["modality"], f'{c["need_bytes"] / 2**20:.0f} MiB',
                   f'{c["share_bytes"] / 2**20:.0f} MiB', c["units"])
                  for c in r.calibrations() if c["device"] == "cuda:0"]
        reserved = r.gpu_peak_mib("cuda:0") if r.returncode == 0 and r.summary else None
        peak = round(reserved) if reserved is not None else None
        refusal = r.error_message()
        embedded = ({m: r.embedded(m) for m in ("video", "audio", "text")}
                    if r.returncode == 0 and r.summary else {})
        run = {"budget": budget, "cmd": " ".join(r.cmd), "returncode": r.returncode,
               "wall_s": round(wall, 2), "embedded": embedded, "shares": shares, "peak_reserved_mib": peak,
               "refusal": refusal, "tail": r.log.splitlines()[-6:]}
        results["runs"].append(run)
        log(f"{budget}: exit {r.returncode} in {wall:.1f} s, embedded {embedded}, shares {shares}, "
            f"peak {peak} MiB")
        if expect == 0:
            limit = int(budget[:-3]) * 1024
            checks.append((f"budget {budget}: ResNet-50 + BERT-base + audio accepted, 64 samples "
                           f"embedded, peak reserved {peak} MiB <= {limit} MiB",
                           r.returncode == 0 and len(shares) == 3 and peak is not None
                           and peak <= limit and set(embedded.values()) == {len(texts)}))
        else:
            checks.append((f"budget {budget}: refused at start-up (exit 2) by the calibration, "
                           f"naming the budget and the fix: {refusal}",
                           r.returncode == 2 and "raise the budget" in refusal))

    results["checks"] = [{"check": c, "ok": ok} for c, ok in checks]
    (args.out / "gpu_budget_split.json").write_text(json.dumps(results, indent=1))
    lines = ["| budget | exit | encoder: need per call -> share per call, units per batch | "
             "peak reserved |", "|---|---:|---|---:|"]
    for run in results["runs"]:
        shares = "; ".join(f"{m}: {need} -> {given}, {units}" for m, need, given, units
                           in run["shares"]) or run["refusal"][-220:]
        lines.append(precompute_run.table_row([run["budget"], run["returncode"], shares,
                                               f"{run['peak_reserved_mib']} MiB"]))
    lines += [""] + [f"- {'PASS' if ok else 'FAIL'}: {c}" for c, ok in checks]
    report = "\n".join(lines)
    (args.out / "gpu_budget_split.md").write_text(report + "\n")
    print(report)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
