"""GPU memory budgets on the GPU machine (issue: memory-bounded batches, OOM recovery, doctor).

Runs precompute's native BERT encoder (random-init BERT-base, bf16) on 50,000 long texts
(100-250 random words, cut at 256 tokens; the text benchmark's data, tools/bench/
text_throughput.py) under run.gpu_memory_budget = 2, 4 and 8 GiB, and without a budget, and
records for each: the token limit the start-up calibration chose, the peak memory the CUDA caching
allocator reserved (precompute's own summary, the allocator's statistics), and the throughput. Then:
a budget too small for one sample must be refused at start-up (exit 2); a budget above what is
free while another process holds most of the card must still finish (out-of-memory errors
recovered by splitting batches); and `precompute doctor` on the same config.

    python3 tools/bench/gpu_memory_budget.py --build build-gpu --out $OUT

Writes gpu_memory_budget.json and gpu_memory_budget.md under --out; exit 1 when a check fails.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  (runs precompute, reads its summary)
import text_throughput as tt  # noqa: E402  (the text benchmark's data)

GIB = 1 << 30


def log(msg: str) -> None:
    print(f"[gpu_memory_budget {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def long_manifest(work: Path, source: Path, copies: int) -> Path:
    """The long texts `copies` times over, with unique ids, for runs that last a few seconds."""
    out = work / f"long-x{copies}.jsonl"
    if not out.exists():
        lines = source.read_text().splitlines()
        with open(out, "w") as f:
            for c in range(copies):
                for line in lines:
                    row = json.loads(line)
                    row["id"] = f"{row['id']}-{c}"
                    f.write(json.dumps(row) + "\n")
    return out


def config(model_dir: Path, manifest: Path, out: Path, budget) -> dict:
    run = {"progress_interval_s": 0, "device": "cuda:0"}
    if budget is not None:
        run["gpu_memory_budget"] = budget
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "dtype": "float16", "shard_size": 8192, "overwrite": True},
        "run": run,
        # Limits far above any budget, so that the budget decides the batch size.
        "text": {"encoder": {"type": "bert", "path": str(model_dir)}, "dtype": "bfloat16",
                 "batch_size": 16384, "max_batch_tokens": 4_000_000, "pooling": "mean",
                 "tokenizer": {"max_length": 256}},
    }


def run(binary: Path, cfg: dict, work: Path, name: str, out_dir: Path, *flags: str,
        timeout: int = 300) -> dict:
    cfg_path = work / f"budget-{name}.yaml"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    try:
        # Its log and summary: OUT/budget-NAME.log, .summary.json; a refusal (exit 2) is a
        # result here, judged by the checks.
        p = precompute_run.run_precompute(binary, cfg_path, out_dir / f"budget-{name}", *flags,
                                          timeout=timeout, ok=(0, 2))
    except precompute_run.PrecomputeFailed as e:
        p = e.run
    done = p.returncode == 0 and p.summary is not None
    res = {"name": name, "cmd": " ".join(p.cmd), "returncode": p.returncode, "wall_s": p.wall_s,
           "summary": p.figures() if done else {}}
    # The limit the start-up calibration chose for the text encoder (None: none was chosen).
    res["token_limit"] = next((c["units"] for c in p.calibrations()
                               if c["modality"] == "text"), None)
    res["refusal"] = p.error_message()
    if done and p.gpu_peak_mib("cuda:0") is not None:
        res["peak_reserved_mib"] = round(p.gpu_peak_mib("cuda:0"))
        res["peak_allocated_mib"] = round(p.gpu_peak_mib("cuda:0", "allocated"))
    res["oom_splits"] = p.summary["run"]["oom_splits"] if done else 0
    res["stderr_tail"] = "\n".join(p.log.splitlines()[-12:])
    log(f"{name}: exit {p.returncode}, {res['summary'].get('per_s')} texts/s, token limit "
        f"{res['token_limit']}, peak reserved {res.get('peak_reserved_mib')} MiB, "
        f"{res['oom_splits']} split(s)")
    return res


HOLDER = r"""
import sys, time, torch
keep = int(sys.argv[1])
free, total = torch.cuda.mem_get_info(0)
block = torch.empty(max(0, free - keep), dtype=torch.uint8, device="cuda:0")
print(f"holding {block.numel() / 2**30:.1f} GiB, leaving {keep / 2**30:.1f} GiB free", flush=True)
time.sleep(float(sys.argv[2]))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build", type=Path, default=Path("build-gpu"))
    p.add_argument("--work", type=Path, default=Path("/tmp/text-bench"))
    p.add_argument("--out", type=Path, default=Path("/tmp/out"))
    p.add_argument("--copies", type=int, default=5)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    binary = args.build / "tools/cli/precompute"
    data = tt.make_data(args.work, 100_000, 10_000, seed=1234, max_length=256)
    model_dir = data["paths"]["model_dir"]
    manifest = long_manifest(args.work, data["paths"]["long"], args.copies)
    n = 10_000 * args.copies
    results, checks = {"texts": n, "runs": []}, []

    for name, budget in [("none", None), ("2GiB", "2GiB"), ("4GiB", "4GiB"), ("8GiB", "8GiB")]:
        r = run(binary, config(model_dir, manifest, args.work / f"out-{name}", budget),
                args.work, name, args.out)
        results["runs"].append(r)
        ok = r["returncode"] == 0 and r["summary"].get("with_embeddings") == n
        if budget is not None:
            limit_mib = int(budget[:-3]) * 1024
            ok = ok and r.get("peak_reserved_mib", 1 << 30) <= limit_mib
            checks.append((f"budget {budget}: all {n} embedded, peak reserved "
                           f"{r.get('peak_reserved_mib')} MiB <= {limit_mib} MiB", ok))
        else:
            checks.append((f"no budget: all {n} embedded", ok))

    small = run(binary, config(model_dir, manifest, args.work / "out-small", "240MiB"),
                args.work, "240MiB", args.out)
    results["too_small"] = small
    checks.append(("budget 240MiB (weights + less than one sample) refused at start-up, exit 2",
                   small["returncode"] == 2 and "run.gpu_memory_budget" in small["refusal"]))

    # Another process holds all but 6 GiB; precompute is told 40 GiB.
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(6 * GIB), "120"],
                              stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline().strip()
    log(f"holder: {line}")
    try:
        forced = run(binary, config(model_dir, manifest, args.work / "out-forced", "40GiB"),
                     args.work, "forced-oom", args.out)
    finally:
        holder.kill()
        holder.wait()
    results["forced_oom"] = forced
    results["forced_oom"]["holder"] = line
    checks.append((f"budget above free memory: run finished, {forced['oom_splits']} OOM "
                   f"split(s) recovered, {forced['summary'].get('with_embeddings')} of {n} "
                   f"embedded", forced["returncode"] == 0
                   and forced["summary"].get("with_embeddings") == n))

    cfg_path = args.work / "budget-doctor.yaml"
    cfg_path.write_text(json.dumps(config(model_dir, manifest, args.work / "out-doctor", "4GiB")))
    d = subprocess.run([str(binary), "doctor", "--config", str(cfg_path), "--json"],
                       capture_output=True, text=True, env=precompute_run.binary_env(binary),
                       timeout=300)
    (args.out / "doctor.json").write_text(d.stdout)
    (args.out / "doctor.log").write_text(d.stderr)
    doctor = json.loads(d.stdout) if d.returncode == 0 and d.stdout.strip() else {}
    results["doctor"] = doctor
    checks.append(("doctor --json on the GPU", d.returncode == 0 and bool(doctor)))

    results["checks"] = [{"check": c, "ok": ok} for c, ok in checks]
    (args.out / "gpu_memory_budget.json").write_text(json.dumps(results, indent=1, default=str))
    lines = ["| budget | token limit per batch | peak reserved (allocated) | texts/s |",
             "|---|---:|---:|---:|"]
    for r in results["runs"]:
        lines.append(precompute_run.table_row(
            [r["name"], r["token_limit"] or "(config: 4,000,000)",
             f"{r.get('peak_reserved_mib')} MiB ({r.get('peak_allocated_mib')} MiB)",
             r["summary"].get("per_s")]))
    if doctor:
        enc = doctor["encoders"][0]
        lines += ["", "doctor (text, largest sample 256 tokens):", "",
                  "| batch | peak reserved | seconds |", "|---:|---:|---:|"]
        for b in enc["batches"]:
            if not b.get("out_of_memory"):
                lines.append(precompute_run.table_row(
                    [b["batch"], f"{b['peak_reserved'] / 2**20:.0f} MiB", f"{b['seconds']:.3f}"]))
        lines.append(f"\npeak per sample {enc.get('peak_per_sample')} B; largest batch in 4 GiB: "
                     f"{enc.get('largest_batch_in_budget')}")
    lines += [""] + [f"- {'PASS' if ok else 'FAIL'}: {c}" for c, ok in checks]
    report = "\n".join(lines)
    (args.out / "gpu_memory_budget.md").write_text(report + "\n")
    print(report)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
