"""AOTInductor `.pt2` encoders on the GPU, end to end through `precompute run` (needs CUDA):
a ResNet-18 (random weights, fixed seed, mean pooled) packaged for cuda by
python/precompute/export.py, in float32 and float16, must store what the same network as
TorchScript stores on the same device and dtype (cosine >= 0.9999 in float32, >= 0.999 in
float16, per clip), while different clips stay below that (so the measure can fail); a package
compiled for the CPU is refused on cuda naming both devices. Prints one JSON line per check and
exits 1 when any fails. Usage (the binary's libraries on LD_LIBRARY_PATH, h5py importable):

  python3 tests/gpu/pt2_parity.py --binary build-gpu/tools/cli/precompute \
      --clips bench-data/parity --work /tmp/pt2-parity
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
from precompute.export import InputSpec, package  # noqa: E402

SIZE = 224
MIN_COSINE = {"float32": 0.9999, "float16": 0.999}


def resnet18(dtype: torch.dtype) -> torch.nn.Module:
    import torchvision
    torch.manual_seed(0)
    net = torchvision.models.resnet18()
    net.fc = torch.nn.Identity()
    return net.eval().to(dtype)


def run(binary: Path, work: Path, name: str, clips: list, model: Path, dtype: str,
        expect: int = 0) -> subprocess.CompletedProcess:
    manifest = work / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": c.stem, "video": str(c)}) + "\n"
                                for c in clips))
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(work / name), "dtype": "float32", "overwrite": True},
              "run": {"device": "cuda"},
              "video": {"encoder": {"path": str(model)}, "sampling": {"fps": 1}, "size": SIZE,
                        "dtype": dtype, "pooling": "mean", "decoder": "cpu"}}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    r = subprocess.run([str(binary), "run", "--config", str(path), "--progress-interval", "0"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != expect:
        print(r.stderr[-3000:], file=sys.stderr)
    return r


def vectors(out: Path) -> dict:
    rows = {}
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            for i, sample in enumerate(f["ids"].asstr()[:]):
                rows[sample] = f["video/embeddings"][i].astype(np.float64)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--clips", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    clips = sorted(c.resolve() for c in args.clips.glob("*.mp4") if "444" not in c.name)[:6]
    failed = 0

    def report(check: str, ok: bool, **facts) -> None:
        nonlocal failed
        failed += not ok
        print(json.dumps({"check": check, "ok": ok, **facts}), flush=True)

    for dtype_name, dtype in (("float32", torch.float32), ("float16", torch.float16)):
        net = resnet18(dtype).cuda()
        ts = args.work / f"resnet18-{dtype_name}.pt"
        with torch.no_grad():
            torch.jit.trace(net, torch.randn(2, 3, SIZE, SIZE, device="cuda", dtype=dtype)).save(
                str(ts))
        pt2 = package(net, [InputSpec((-1, 3, SIZE, SIZE), dtype_name)],
                      args.work / f"resnet18-{dtype_name}.pt2", device="cuda")
        a = run(args.binary, args.work, f"ts-{dtype_name}", clips, ts, dtype_name)
        b = run(args.binary, args.work, f"pt2-{dtype_name}", clips, pt2, dtype_name)
        if a.returncode or b.returncode:
            report(f"runs {dtype_name}", False, exits=[a.returncode, b.returncode])
            continue
        va, vb = vectors(args.work / f"ts-{dtype_name}"), vectors(args.work / f"pt2-{dtype_name}")
        cos = {k: float(va[k] @ vb[k] / (np.linalg.norm(va[k]) * np.linalg.norm(vb[k])))
               for k in va}
        keys = sorted(va)
        across = max(float(va[x] @ va[y] / (np.linalg.norm(va[x]) * np.linalg.norm(va[y])))
                     for x in keys for y in keys if x < y)
        report(f"pt2 equals torchscript, {dtype_name}",
               sorted(va) == sorted(vb) and min(cos.values()) >= MIN_COSINE[dtype_name]
               and across < MIN_COSINE[dtype_name],
               clips=len(keys), min_cosine=min(cos.values()), max_cosine_across_clips=across)
    cpu = package(resnet18(torch.float32), [InputSpec((-1, 3, SIZE, SIZE))],
                  args.work / "resnet18-cpu.pt2", device="cpu")
    r = run(args.binary, args.work, "cpu-package", clips, cpu, "float32", expect=2)
    report("a cpu package is refused on cuda", r.returncode == 2 and
           "was compiled for cpu, and video runs on cuda" in r.stderr, exit=r.returncode)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
