"""The text path's own ceiling: a text job whose model costs almost nothing, so that what bounds
it is precompute itself (reading the manifest, tokenizing, routing, the encode calls' packing and
copies, assembling, building and committing the shards). Issue 10 asks why 1,000,000 captions
ran only 1.2x faster on two GPUs than on one; whatever this job reaches is the most any number
of GPUs can give.

The model: a TorchScript EmbeddingBag (mean of the token vectors, width --dim, random weights),
`pooling: model`, so one call is a gather and a mean. Captions: N(12, 5) words from a vocabulary
of 20,000 random words (as text_throughput.py makes them), written once under --work. Each
binary given with --binary runs --runs times, the binaries taking turns, so that a before/after
pair shares the machine's state; the median run of each is reported: whole process, precompute's
run clock, its busy seconds per stage, CPU seconds and minor page faults of the process.

  .venv/bin/python tools/bench/text_pipeline_ceiling.py --binary build/tools/cli/precompute
  .venv/bin/python tools/bench/text_pipeline_ceiling.py --binary /tmp/old --binary /tmp/new
  python3 tools/bench/text_pipeline_ceiling.py --binary build-gpu/tools/cli/precompute \\
      --device cuda:0 --captions 1000000      # the GPU machine, with the copies to and from it

Prints one JSON line per run and writes --work/text_pipeline_ceiling.json.
"""
import argparse
import json
import random
import resource
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  runs precompute and reads its summary (same folder)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_inputs(work: Path, captions: int, dim: int, seed: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    stamp = work / "inputs.json"
    params = {"captions": captions, "dim": dim, "seed": seed, "version": 1}
    paths = {"vocab": work / "vocab.txt", "model": work / f"bag{dim}.pt",
             "manifest": work / f"captions{captions}.jsonl"}
    if stamp.exists() and json.loads(stamp.read_text()) == params and all(
            p.exists() for p in paths.values()):
        return paths
    rng = random.Random(seed)
    words = set()
    while len(words) < 20000:
        words.add("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))))
    words = sorted(words)
    paths["vocab"].write_text("\n".join(SPECIALS + words) + "\n")
    with open(paths["manifest"], "w") as f:
        for i in range(captions):
            text = " ".join(rng.choices(words, k=max(1, int(rng.gauss(12, 5)))))
            f.write(json.dumps({"id": f"t{i:08d}", "text": text}) + "\n")

    import torch

    class Bag(torch.nn.Module):
        def __init__(self, vocab: int, width: int):
            super().__init__()
            self.bag = torch.nn.EmbeddingBag(vocab, width, mode="mean")

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bag(input_ids)

    torch.manual_seed(seed)
    torch.jit.script(Bag(len(SPECIALS) + len(words), dim)).save(str(paths["model"]))
    stamp.write_text(json.dumps(params))
    return paths


def run_once(binary: Path, paths: dict, work: Path, device: list, tag: str) -> dict:
    out = work / f"out-{tag}"
    config = {
        "input": {"manifest": str(paths["manifest"])},
        "output": {"path": str(out), "overwrite": True, "shard_size": 8192, "dtype": "float16"},
        "run": {"device": device, "progress_interval_s": 0},
        "text": {"encoder": {"type": "torchscript", "path": str(paths["model"])},
                 "batch_size": 4096, "max_batch_tokens": 65536, "pooling": "model",
                 "tokenizer": {"vocab": str(paths["vocab"]), "max_length": 128}},
    }
    faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    run = precompute_run.run_precompute(binary, config, work / tag, timeout=1800)
    return {"binary": str(binary), "samples": run.samples, "whole_s": round(run.wall_s, 3),
            "run_s": run.run_s, "busy": run.busy, "cpu_s": round(run.cpu_s, 2),
            "minor_faults": resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - faults}


def median_run(runs: list) -> dict:
    mid = precompute_run.median_run(runs, key=lambda r: r["run_s"])
    whole_s = precompute_run.median(r["whole_s"] for r in runs)
    run_s = precompute_run.median(r["run_s"] for r in runs)
    return {"binary": mid["binary"], "runs": len(runs), "whole_s": whole_s, "run_s": run_s,
            "whole_per_s": round(mid["samples"] / whole_s),
            "run_per_s": round(mid["samples"] / run_s),
            "busy_of_median_run": mid["busy"],
            "cpu_s": precompute_run.median(r["cpu_s"] for r in runs),
            "minor_faults": precompute_run.median(r["minor_faults"] for r in runs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", action="append", type=Path, required=True,
                   help="precompute binary; give it twice or more to compare, runs alternate")
    p.add_argument("--captions", type=int, default=200000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--device", default="cpu", help="run.device, comma-separated for several")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("/tmp/text-pipeline-ceiling"))
    a = p.parse_args()
    if a.captions < 1 or a.runs < 1 or a.dim < 1:
        p.error("--captions, --runs and --dim must be positive")
    paths = make_inputs(a.work, a.captions, a.dim, a.seed)
    device = [d.strip() for d in a.device.split(",") if d.strip()]
    runs = {str(b): [] for b in a.binary}
    for i in range(a.runs):
        for k, b in enumerate(a.binary):
            r = run_once(b, paths, a.work, device, f"b{k}")
            print(json.dumps(r), flush=True)
            runs[str(b)].append(r)
    result = {"captions": a.captions, "dim": a.dim, "device": device,
              "medians": [median_run(v) for v in runs.values()], "runs": runs}
    for m in result["medians"]:
        print(json.dumps(m), flush=True)
    (a.work / "text_pipeline_ceiling.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
