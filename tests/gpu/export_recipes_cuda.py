"""The export recipes compiled for CUDA, checked through `precompute run` (needs a GPU).

`python -m precompute.export RECIPE FOLDER OUT.pt2 --device cuda --dtype D` for wav2vec2, hubert,
whisper-encoder, clip-vision, siglip-vision and videomae (random-weight models from transformers'
config classes, tools/scripts/tiny_*_models.py, no download) and torchvision resnet18 (random
weights saved as a state_dict file), in each dtype of --dtypes
(float32, float16, bfloat16). The packages are loaded the way users load them, by `precompute
run` on cuda (PyTorch 2.11's own Python loader, torch._inductor.aoti_load_package, crashes on
CUDA packages, so it is not the reference here):

* audio: two WAV clips (12 s and 3 s, 16 kHz); every stored window row must be what the recipe's
  own module, run eagerly on cuda in the same dtype, returns for the same window (the decoded
  samples, zero-padded to the package's window_s, with their lengths): per row cosine >= 0.9999
  in float32, >= 0.999 in float16, >= 0.99 in bfloat16, and each stored row nearer its own
  window's expected row than any other window's (so the check fails when a package returns the
  wrong window's vector, even for a random model whose rows all lie within cosine 0.9999 of one
  another, as HuBERT's do). Whisper's package computes its log-mel front end with
  PyTorch's STFT, which AOTInductor calls as an ATen kernel: this is where CUDA could differ from
  the CPU, which tests/python/test_export_audio_recipes.py covers.
* video (torchvision, clip-vision, siglip-vision, videomae): the clips of --clips
  (tools/bench/make_video_clips.sh parity) through the cuda package must store what the same
  recipe compiled for the CPU stores on the CPU (which tests/python/test_export_torchvision.py
  and test_export_recipes.py check against the eager model), frame by frame (VideoMAE: clip by
  clip), less the mean row (a random network's features are otherwise alike across clips), with
  the audio check's cosines, while the clips' first rows stay apart. The CPU run happens on the
  GPU machine, so it also checks that a run on the CPU there ends well.

Prints one JSON line per check; exit 1 when any fails. --device cpu runs the same checks with
packages compiled for the CPU (the video ones then compare a CPU package with itself),
to try the script where there is no GPU. Usage (from the repository root; the binary's
libraries come from its build's precompute-env.sh):

  python3 tests/gpu/export_recipes_cuda.py --binary build-gpu/tools/cli/precompute \\
      --clips bench-data/parity --work /tmp/export-cuda
"""
import argparse
import concurrent.futures
import faulthandler
import json
import os
import subprocess
import sys
import time
import wave
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import h5py
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tools" / "scripts"))
sys.path.insert(0, str(ROOT / "tools" / "bench"))
from precompute.export import DTYPES, RECIPES  # noqa: E402
from precompute_run import binary_env  # noqa: E402
from tiny_audio_models import tiny_audio_folder  # noqa: E402
from tiny_vision_models import RECIPES as TINY_VISION, tiny_vision_folder  # noqa: E402

# bfloat16 keeps 8 bits of mantissa against float16's 11: its rows sit further from float32's.
MIN_COSINE = {"float32": 0.9999, "float16": 0.999, "bfloat16": 0.99}
RATE = 16000


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def declaration(package: Path) -> dict:
    """The settings the package declares (its sidecar inside the archive)."""
    with zipfile.ZipFile(package) as z:
        name = next(n for n in z.namelist() if n.endswith("wrapper_metadata.json"))
        return json.loads(json.loads(z.read(name))["precompute.encoder"])


def export(recipe: str, source: str, package: Path, device: str, dtype: str, extra: list):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    started = time.time()
    r = subprocess.run([sys.executable, "-m", "precompute.export", recipe, source, str(package),
                        "--device", device, "--dtype", dtype, *extra],
                       capture_output=True, text=True, env=env, timeout=900)
    return r, round(time.time() - started, 1)


def run(binary: Path, work: Path, name: str, samples: list, section: str, body: dict,
        device: str) -> subprocess.CompletedProcess:
    manifest = work / f"{name}.jsonl"
    manifest.write_text("".join(json.dumps(s) + "\n" for s in samples))
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(work / name), "dtype": "float32", "overwrite": True},
              "run": {"device": device}, section: body}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    return subprocess.run([str(binary), "run", "--config", str(path), "--progress-interval", "0"],
                          capture_output=True, text=True, timeout=600, env=binary_env(binary))


def stored(out: Path, modality: str) -> dict:
    """id -> the stored rows [R, D] (pooling none) or vector [D], float64."""
    values = {}
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            ids = f["ids"].asstr()[:]
            group = f[modality]
            if "offsets" in group:   # per_step: sample i owns rows offsets[i]:offsets[i+1]
                offsets = group["offsets"][:]
                for i, sample in enumerate(ids):
                    values[sample] = group["values"][offsets[i]:offsets[i + 1]].astype(
                        np.float64)
            else:
                for i, sample in enumerate(ids):
                    values[sample] = group["embeddings"][i].astype(np.float64)
    return values


def wav_clips(work: Path) -> list:
    """Two sine tones as 16-bit mono WAV, written here so that the check needs no ffmpeg CLI."""
    clips = []
    for i, (frequency, seconds) in enumerate([(220.0, 12.0), (523.0, 3.0)]):
        path = work / f"a{i}.wav"
        if not path.exists():
            t = np.arange(int(seconds * RATE)) / RATE
            samples = np.round(0.125 * 32767 * np.sin(2 * np.pi * frequency * t)).astype("<i2")
            with wave.open(str(path), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(RATE)
                w.writeframes(samples.tobytes())
        clips.append({"id": f"a{i}", "audio": str(path)})
    return clips


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2") / 32768.0


def audio_check(args, recipe: str, dtype: str, package: Path, source: str) -> dict:
    window = int(round(declaration(package)["audio"]["window_s"] * RATE))
    clips = wav_clips(args.work)
    r = run(args.binary, args.work, f"{recipe}-{dtype}", clips, "audio",
            {"encoder": {"path": str(package)}, "pooling": "none", "dtype": dtype}, args.device)
    if r.returncode != 0:
        return {"ok": False, "error": r.stderr[-1500:]}
    got = stored(args.work / f"{recipe}-{dtype}", "audio")
    torch.manual_seed(0)
    recipe_args = SimpleNamespace(dtype=dtype, window_s=None, frames=0, projection=False,
                                  weights=None)
    module = RECIPES[recipe](Path(source), recipe_args)[0]
    module.model.to(DTYPES[dtype])
    module = module.eval().to(args.device)
    rows_got, rows_expected = [], []
    for clip in clips:
        samples = read_wav(Path(clip["audio"]))
        starts = list(range(0, len(samples), window))
        wave_rows = torch.zeros(len(starts), window)
        lengths = []
        for k, start in enumerate(starts):
            piece = samples[start:start + window]
            wave_rows[k, :len(piece)] = torch.from_numpy(piece.astype(np.float32))
            lengths.append(len(piece))
        with torch.no_grad():
            expected = module(wave_rows.to(args.device, DTYPES[dtype]),
                              torch.tensor(lengths, device=args.device))
        rows_expected.append(expected.float().cpu().numpy())
        rows_got.append(np.atleast_2d(got[clip["id"]]))
    a, b = np.concatenate(rows_got), np.concatenate(rows_expected)
    if a.shape != b.shape:
        return {"ok": False, "shapes": [list(a.shape), list(b.shape)]}
    cos = cosines(a, b)
    apart = cosines(np.repeat(b[:1], len(b) - 1, 0), b[1:])
    # distance[i, j]: stored row i to expected row j. A row's own distance against the nearest
    # other window's: below 1 when each row is its own window's.
    distance = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    others = distance + np.diag(np.full(len(b), np.inf))
    nearest = float((np.diag(distance) / others.min(1)).max())
    return {"rows": len(a), "max_abs": float(np.abs(a - b).max()),
            "min_cosine": round(float(cos.min()), 7),
            "max_cosine_between_rows": round(float(apart.max()), 5),
            "own_over_nearest_other": round(nearest, 4),
            "ok": bool(cos.min() >= MIN_COSINE[dtype] and nearest < 1.0)}


VIDEO_RECIPES = ("torchvision", *TINY_VISION)


def source_of(args, recipe: str):
    """The recipe's model (a folder made here, or torchvision's name) and its extra arguments."""
    if recipe == "torchvision":
        weights = args.work / "resnet18.pth"
        if not weights.exists():
            import torchvision
            torch.manual_seed(0)
            torch.save(torchvision.models.resnet18().state_dict(), weights)
        return "resnet18", ["--weights", str(weights)]
    folder = args.work / recipe
    if not (folder / "config.json").exists():
        if recipe in TINY_VISION:
            tiny_vision_folder(recipe, folder)
        else:
            tiny_audio_folder(recipe, folder, width=64)
    return str(folder), []


def cpu_reference(args, recipe: str) -> Path:
    return args.work / f"{recipe}-cpu-float32.pt2"


def video_check(args, recipe: str, dtype: str, package: Path,
                reference: Optional[concurrent.futures.Future]) -> dict:
    """`reference`: the export of cpu_reference() under way, or None where it was made before."""
    clips = sorted(c.resolve() for c in args.clips.glob("*.mp4") if "444" not in c.name)[:6]
    if not clips:
        return {"ok": False, "error": f"no clips in {args.clips}"}
    samples = [{"id": c.stem, "video": str(c)} for c in clips]
    cpu_package = cpu_reference(args, recipe)
    if reference is not None:
        r, _ = reference.result()
        if r.returncode != 0:
            return {"ok": False, "error": "cpu export: " + r.stderr[-1500:]}
    # Every frame's row (pooling none): frames of different clips are further apart than the
    # clips' means, so the measure can fail in float16 too. VideoMAE's clips layout gives one
    # row a clip (its sampling comes from the package; pooling: model keeps the model's vector).
    body = {"pooling": "model", "decoder": "cpu"} if recipe == "videomae" else \
        {"sampling": {"fps": 1}, "pooling": "none", "decoder": "cpu"}
    on_cuda = run(args.binary, args.work, f"{recipe}-{dtype}", samples, "video",
                  {**body, "encoder": {"path": str(package)}, "dtype": dtype}, args.device)
    on_cpu = run(args.binary, args.work, f"{recipe}-cpu", samples, "video",
                 {**body, "encoder": {"path": str(cpu_package)}, "dtype": "float32"}, "cpu")
    if on_cuda.returncode or on_cpu.returncode:
        failed = on_cuda if on_cuda.returncode else on_cpu  # the first run that failed
        return {"ok": False, "exits": [on_cuda.returncode, on_cpu.returncode],
                "error": failed.stderr[-1500:]}
    a = stored(args.work / f"{recipe}-{dtype}", "video")
    b = stored(args.work / f"{recipe}-cpu", "video")
    keys = sorted(b)
    if sorted(a) != keys or any(a[k].shape != b[k].shape for k in keys):
        return {"ok": False, "ids": [sorted(a), keys]}
    got = np.concatenate([np.atleast_2d(a[k]) for k in keys])
    expected = np.concatenate([np.atleast_2d(b[k]) for k in keys])
    # A random network's features of natural frames all point one way (cosine 0.999 between
    # clips for ResNet-18), so the rows are compared less their mean: what tells frames apart.
    mean = expected.mean(0, keepdims=True)
    cos = cosines(got - mean, expected - mean)
    firsts = np.stack([np.atleast_2d(b[k])[0] for k in keys]) - mean
    across = cosines(np.repeat(firsts[:1], len(keys) - 1, 0), firsts[1:])
    return {"clips": len(keys), "rows": len(got), "min_cosine": round(float(cos.min()), 7),
            "max_cosine_across_clips": round(float(across.max()), 5),
            "ok": bool(cos.min() >= MIN_COSINE[dtype] and across.max() < MIN_COSINE[dtype])}


def main() -> int:
    faulthandler.enable()
    p = argparse.ArgumentParser()
    p.add_argument("--binary", type=Path, required=True)
    p.add_argument("--clips", type=Path, default=ROOT / "bench-data" / "parity",
                   help="video clips for the torchvision recipe")
    p.add_argument("--work", type=Path, default=Path("/tmp/export-cuda"))
    p.add_argument("--recipes", default="wav2vec2,hubert,whisper-encoder,torchvision,"
                   "clip-vision,siglip-vision,videomae")
    p.add_argument("--device", default="cuda", help="cpu: the same checks without a GPU")
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--jobs", type=int, default=4, help="exports compiled at once")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # Compiling is most of the time and each export is one process: they run side by side, the
    # checks (one GPU run each) one after another.
    recipes = args.recipes.split(",")
    sources = {recipe: source_of(args, recipe) for recipe in recipes}
    exports = [(recipe, dtype, *sources[recipe], args.work / f"{recipe}-{dtype}.pt2")
               for recipe in recipes for dtype in args.dtypes.split(",")]
    # Each check runs as soon as its package is made, so a check cut short by a time limit still
    # leaves the lines of those before it.
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        # The video checks' references, compiled for the CPU (video_check).
        references = {}
        for recipe in recipes:
            if recipe in VIDEO_RECIPES and not cpu_reference(args, recipe).exists():
                source, extra = sources[recipe]
                references[recipe] = pool.submit(export, recipe, source,
                                                 cpu_reference(args, recipe), "cpu", "float32",
                                                 extra)
        done = [pool.submit(export, recipe, source, package, args.device, dtype, extra)
                for recipe, dtype, source, extra, package in exports]
        for (recipe, dtype, source, extra, package), future in zip(exports, done):
            r, compile_s = future.result()
            check = {"recipe": recipe, "device": args.device, "dtype": dtype,
                     "compile_s": compile_s}
            if r.returncode != 0:
                check.update(ok=False, error=r.stderr[-1500:])
            elif recipe in VIDEO_RECIPES:
                check.update(video_check(args, recipe, dtype, package, references.get(recipe)))
            else:
                check.update(audio_check(args, recipe, dtype, package, source))
            failed += not check["ok"]
            print(json.dumps(check), flush=True)
    print(json.dumps({"checks_failed": failed}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
