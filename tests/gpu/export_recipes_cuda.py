"""The export recipes compiled for CUDA (needs a GPU): `python -m precompute.export RECIPE FOLDER
OUT.pt2 --device cuda --dtype D` for wav2vec2, hubert and whisper-encoder (random-weight models
from transformers' config classes, no download) and torchvision resnet18 (random weights saved
as a state_dict file), in
float32 and float16. Each package, loaded on cuda, must return what the recipe's own module
returns eagerly on the same device and dtype for the same batch (per row cosine >= 0.9999 in
float32, >= 0.999 in float16; max abs difference reported), while rows of different inputs stay
apart (so the measure can fail). Whisper's package computes its log-mel front end with PyTorch's
STFT, which AOTInductor calls as an ATen kernel: this is where CUDA could differ from the CPU,
which tests/python/test_export_audio_recipes.py covers. Prints one JSON line per check; exit 1
when any fails. Usage (from the repository root):

  python3 tests/gpu/export_recipes_cuda.py --work /tmp/export-cuda
"""
import argparse
import faulthandler
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tools" / "scripts"))
from precompute.export import DTYPES, RECIPES  # noqa: E402
from tiny_audio_models import tiny_audio_folder  # noqa: E402

MIN_COSINE = {"float32": 0.9999, "float16": 0.999}


def inputs_for(recipe: str, dtype: torch.dtype) -> tuple:
    g = torch.Generator().manual_seed(1)
    if recipe == "torchvision":
        return (torch.randn(4, 3, 224, 224, generator=g).to(dtype),)
    samples = 480000 if recipe == "whisper-encoder" else 160000
    lengths = torch.tensor([samples, samples // 3, 16000, 900])
    wave = 0.1 * torch.randn(4, samples, generator=g)
    wave[torch.arange(samples)[None, :] >= lengths[:, None]] = 0
    return wave.to(dtype), lengths


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = a.float(), b.float()
    return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1))


def main() -> int:
    faulthandler.enable()
    p = argparse.ArgumentParser()
    p.add_argument("--work", type=Path, default=Path("/tmp/export-cuda"))
    p.add_argument("--device", default="cuda", help="cpu: the same checks on the CPU")
    p.add_argument("--recipes", default="wav2vec2,hubert,whisper-encoder,torchvision")
    p.add_argument("--dtypes", default="float32,float16")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    failed = 0
    for recipe in args.recipes.split(","):
        if recipe == "torchvision":
            weights = args.work / "resnet18.pth"
            if not weights.exists():
                import torchvision
                torch.manual_seed(0)
                torch.save(torchvision.models.resnet18().state_dict(), weights)
            source, extra = "resnet18", ["--weights", str(weights)]
        else:
            source, extra = str(args.work / recipe), []
            if not (args.work / recipe / "config.json").exists():
                tiny_audio_folder(recipe, args.work / recipe, width=64)
        for dtype in args.dtypes.split(","):
            package = args.work / f"{recipe}-{dtype}.pt2"
            started = time.time()
            r = subprocess.run([sys.executable, "-m", "precompute.export", recipe, source,
                                str(package), "--device", args.device, "--dtype", dtype, *extra],
                               capture_output=True, text=True, env=env, timeout=900)
            compile_s = round(time.time() - started, 1)
            check = {"recipe": recipe, "device": args.device, "dtype": dtype,
                     "compile_s": compile_s}
            if r.returncode != 0:
                check.update(ok=False, error=r.stderr[-1500:])
            else:
                # The recipe's own module, eager, on the same device and dtype.
                recipe_args = SimpleNamespace(dtype=dtype, window_s=None, frames=0,
                                              projection=False,
                                              weights=extra[1] if extra else None)
                torch.manual_seed(0)
                module = RECIPES[recipe](Path(source), recipe_args)[0]
                module.model.to(DTYPES[dtype])
                module = module.eval().to(args.device)
                loaded = torch._inductor.aoti_load_package(str(package))
                x = tuple(t.to(args.device) for t in inputs_for(recipe, DTYPES[dtype]))
                with torch.no_grad():
                    got, expected = loaded(*x), module(*x)
                cos = cosines(got, expected)
                apart = cosines(expected[:1].expand_as(expected[1:]), expected[1:])
                check.update(shape=list(got.shape),
                             max_abs=float((got.float() - expected.float()).abs().max()),
                             min_cosine=round(cos.min().item(), 7),
                             max_cosine_between_rows=round(apart.max().item(), 5),
                             ok=bool(got.shape == expected.shape
                                     and cos.min().item() >= MIN_COSINE[dtype]
                                     and apart.max().item() < MIN_COSINE[dtype]))
            failed += not check["ok"]
            print(json.dumps(check), flush=True)
    print(json.dumps({"checks_failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
