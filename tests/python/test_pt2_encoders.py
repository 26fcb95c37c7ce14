"""AOTInductor `.pt2` encoders (python/precompute/export.py makes them): a package stores what its
TorchScript twin stores, and everything that would embed silently wrong is refused at start-up
with a message naming both sides and the fix: another input size or dtype than the package
declares, a package that declares nothing, a package for another device, a file that is no
package, a package under text. Packages are compiled here, on the CPU, from the demo encoders."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import colour_clip, read_output, run_precompute, sine_file, write_manifest

SIZE = 48  # the frame size the video package is exported for


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """video.pt2 / video.pt: the demo's frame encoder as a package (frames [-1, 3, 48, 48], its
    preprocessing declared: size 48, mean 0.5, std 0.25) and as TorchScript; audio.pt2 / audio.pt the same for the demo's audio encoder (1 s windows)."""
    import torch
    import export_encoders as demo
    from precompute.export import InputSpec, package
    root = tmp_path_factory.mktemp("pt2")
    video, audio = demo.TinyFrameFeatures().eval(), demo.LogMelFeatures().eval()
    package(video, [InputSpec((-1, 3, SIZE, SIZE))], root / "video.pt2",
            settings={"video": {"size": [SIZE, SIZE], "mean": [0.5, 0.5, 0.5],
                                "std": [0.25, 0.25, 0.25]}})
    torch.jit.save(torch.jit.script(video), str(root / "video.pt"))
    package(audio, [InputSpec((-1, 16000)), InputSpec((-1,), "int64")], root / "audio.pt2")
    torch.jit.save(torch.jit.script(audio), str(root / "audio.pt"))
    return root


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pt2 media")
    rows = []
    for i, colours in enumerate([["red", "blue"], ["green"], ["white", "black", "yellow"]]):
        clip = root / f"c{i}.mp4"
        colour_clip(clip, colours)
        tone = root / f"t{i}.wav"
        sine_file(tone, 220.0 * (i + 1), 2.5)
        rows.append({"id": f"s{i}", "video": str(clip), "audio": str(tone)})
    return write_manifest(root / "m.jsonl", rows)


def config(manifest: Path, out: Path, video: Path = None, audio: Path = None, **video_keys):
    c = {"input": {"manifest": str(manifest)}, "output": {"path": str(out)}}
    if video is not None:
        c["video"] = {"encoder": {"path": str(video)}, "sampling": {"fps": 2}, "size": SIZE,
                      "mean": [0.5] * 3, "std": [0.25] * 3, "pooling": "none", **video_keys}
    if audio is not None:
        c["audio"] = {"encoder": {"path": str(audio)}, "sample_rate": 16000, "window_s": 1.0,
                      "pooling": "none"}
    return c


def rows(out: Path, modality: str) -> np.ndarray:
    output = read_output(out)
    return np.concatenate([output.samples[i][modality]["rows"] for i in sorted(output.samples)])


def test_a_package_stores_what_its_torchscript_twin_stores(binary, models, manifest, tmp_path):
    run_precompute(binary, tmp_path, config(manifest, tmp_path / "ts", models / "video.pt",
                                            models / "audio.pt"))
    r = run_precompute(binary, tmp_path, config(manifest, tmp_path / "pt2",
                                                models / "video.pt2", models / "audio.pt2"))
    assert "3 with embeddings (video 3, audio 3," in r.stderr, r.stderr[-2000:]
    for modality in ("video", "audio"):
        a, b = rows(tmp_path / "ts", modality), rows(tmp_path / "pt2", modality)
        assert a.shape == b.shape and len(a) >= 6
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        assert cos.min() >= 0.9999, f"{modality}: cosine {cos.min()}"
    # The stored record names the format: a rerun with the TorchScript file is a changed model.
    index = json.loads((tmp_path / "pt2" / "index.json").read_text())
    assert '"pt2"' in json.dumps(index)


def test_another_frame_size_than_the_package_takes_is_refused_naming_both(binary, models,
                                                                          manifest, tmp_path):
    out = tmp_path / "out"
    c = config(manifest, out, models / "video.pt2")
    c["video"]["size"] = 64
    r = run_precompute(binary, tmp_path, c, expect=2)
    assert f"takes [-1, 3, {SIZE}, {SIZE}] float32 and was given [1, 3, 64, 64] float32" \
        in r.stderr, r.stderr[-2000:]
    assert "video.size [64, 64]" in r.stderr and "this call was refused, not run" in r.stderr
    assert not list(out.glob("*.h5")) and not (out / "index.json").exists(), \
        "a refused start-up wrote an output"


def test_another_dtype_than_the_package_takes_is_refused(binary, models, manifest, tmp_path):
    c = config(manifest, tmp_path / "out", models / "video.pt2", dtype="bfloat16")
    r = run_precompute(binary, tmp_path, c, expect=2)
    assert f"takes [-1, 3, {SIZE}, {SIZE}] float32 and video.dtype is bfloat16" in r.stderr
    assert "set video.dtype to the package's, or export it again in bfloat16" in r.stderr


def without_declaration(package: Path, to: Path) -> Path:
    """The package as a tool other than precompute's exporter writes it: no inputs declared."""
    with zipfile.ZipFile(package) as src, zipfile.ZipFile(to, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("wrapper_metadata.json"):
                meta = json.loads(data)
                assert "precompute.encoder" in meta
                del meta["precompute.encoder"]
                data = json.dumps(meta).encode()
            dst.writestr(item, data)
    return to


def test_a_package_that_declares_no_inputs_is_refused_until_a_sidecar_says(binary, models,
                                                                            manifest, tmp_path):
    bare = without_declaration(models / "video.pt2", tmp_path / "bare.pt2")
    r = run_precompute(binary, tmp_path, config(manifest, tmp_path / "out", bare), expect=2)
    assert "does not say what input it takes" in r.stderr, r.stderr[-2000:]
    assert f"{bare}.json" in r.stderr
    # The sidecar the message asks for, written by hand: the run goes on, and matches.
    Path(f"{bare}.json").write_text(json.dumps(
        {"inputs": [{"shape": [-1, 3, SIZE, SIZE], "dtype": "float32"}]}))
    run_precompute(binary, tmp_path, config(manifest, tmp_path / "out", bare))
    run_precompute(binary, tmp_path, config(manifest, tmp_path / "ref", models / "video.pt2"))
    assert np.array_equal(rows(tmp_path / "out", "video"), rows(tmp_path / "ref", "video"))
    # A sidecar that is not what it must be: named, with what is wrong.
    for text, says in [("{", "not valid JSON"), ('{"inputs": []}', 'non-empty "inputs"'),
                       ('{"inputs": [{"shape": [-1, 0], "dtype": "float32"}]}', "holds 0"),
                       ('{"inputs": [{"shape": [-1], "dtype": "complex64"}]}', "complex64")]:
        Path(f"{bare}.json").write_text(text)
        r = run_precompute(binary, tmp_path, config(manifest, tmp_path / "bad", bare), expect=2)
        assert says in r.stderr and f"{bare}.json" in r.stderr, (text, r.stderr[-1500:])


def test_a_file_that_is_no_package_is_refused(binary, models, manifest, tmp_path):
    fake = tmp_path / "model.pt2"
    shutil.copy(models / "video.pt", fake)  # a TorchScript archive under a package's name
    r = run_precompute(binary, tmp_path, config(manifest, tmp_path / "out", fake), expect=2)
    assert "is not an AOTInductor package" in r.stderr, r.stderr[-2000:]
    assert "encoder.type: torchscript" in r.stderr
    # Named as TorchScript, the same file loads as one.
    c = config(manifest, tmp_path / "out", fake)
    c["video"]["encoder"]["type"] = "torchscript"
    run_precompute(binary, tmp_path, c)


def test_a_package_for_the_cpu_is_refused_on_a_gpu_and_text_takes_none(binary, models, manifest,
                                                                       tmp_path):
    c = config(manifest, tmp_path / "out", models / "video.pt2")
    c["video"]["device"] = "cuda"
    r = run_precompute(binary, tmp_path, c, expect=None)
    assert r.returncode == 2, r.stderr[-2000:]
    # Without a GPU the device is refused first; with one, the package names its device.
    assert "was compiled for cpu, and video runs on cuda" in r.stderr or "cuda" in r.stderr
    c = config(manifest, tmp_path / "out")
    c["text"] = {"encoder": {"path": str(models / "video.pt2")}}
    r = run_precompute(binary, tmp_path, c, expect=2)
    assert "text encoders are TorchScript files or BERT folders" in r.stderr, r.stderr[-2000:]
    c["text"]["encoder"]["type"] = "pt2"
    r = run_precompute(binary, tmp_path, c, expect=2)
    assert "use one of: torchscript, bert" in r.stderr


def unpacked_in_tmp() -> set:
    """Folders in /tmp that hold an unpacked package (LibTorch's loader ignores TMPDIR)."""
    return {p for p in Path("/tmp").iterdir()
            if p.is_dir() and len(p.name) == 6 and any(p.glob("*/data/aotinductor"))}


def test_unpacked_packages_leave_nothing_in_tmp_even_after_a_kill(binary, models, manifest,
                                                                  tmp_path):
    """The loader unpacks a package into /tmp: neither a finished run nor a run killed with -9
    once its models are loaded leaves a copy there (Note [Unpacked packages])."""
    before = unpacked_in_tmp()
    c = config(manifest, tmp_path / "out", models / "video.pt2", models / "audio.pt2")
    run_precompute(binary, tmp_path, c)
    assert unpacked_in_tmp() - before == set()
    r = run_precompute(binary, tmp_path, c, "--no-supervisor", "--overwrite", expect=None,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@1"})
    assert r.returncode == -9, r.stderr[-2000:]
    assert unpacked_in_tmp() - before == set()


def test_a_killed_gpu_runs_unpacked_package_is_removed_by_the_next_run(binary, models, manifest,
                                                                       tmp_path):
    """A package for cuda keeps its folder while it runs (its kernels load from it), named in the
    ledger /tmp/precompute-pt2 as <pid>.<folder> (Note [Unpacked packages]); the next load on the
    machine removes the folders of ended processes and keeps those of live ones. Played here with
    ledger entries made by hand: a process that has ended, one still running."""
    ledger = Path("/tmp/precompute-pt2")
    ledger.mkdir(exist_ok=True)
    ended = subprocess.Popen(["true"])
    ended.wait()
    alive = subprocess.Popen(["sleep", "60"])
    folders = {}
    try:
        for who, pid in (("ended", ended.pid), ("alive", alive.pid)):
            while True:
                name = secrets.token_hex(3)
                if not (Path("/tmp") / name).exists():
                    break
            folder = Path("/tmp") / name
            (folder / "model" / "data" / "aotinductor").mkdir(parents=True)
            (ledger / f"{pid}.{name}").touch()
            folders[who] = (folder, ledger / f"{pid}.{name}")
        # An entry naming something that is no loader's folder is dropped without a removal.
        (ledger / f"{ended.pid}.tmp").touch()
        run_precompute(binary, tmp_path, config(manifest, tmp_path / "out",
                                                models / "video.pt2", models / "audio.pt2"))
        assert not folders["ended"][0].exists() and not folders["ended"][1].exists()
        assert folders["alive"][0].exists() and folders["alive"][1].exists()
        assert not (ledger / f"{ended.pid}.tmp").exists() and Path("/tmp").exists()
    finally:
        alive.kill()
        alive.wait()
        for folder, entry in folders.values():
            shutil.rmtree(folder, ignore_errors=True)
            entry.unlink(missing_ok=True)


def test_a_package_brings_its_preprocessing_and_the_config_file_still_wins(
        binary, models, manifest, tmp_path):
    """Keys the config file leaves out take the package's values (logged with their source and
    kept in index.json); a key it sets wins, with a warning naming both values."""
    c = config(manifest, tmp_path / "declared", models / "video.pt2")
    for key in ("size", "mean", "std"):
        del c["video"][key]
    r = run_precompute(binary, tmp_path, c)
    for line in (f"video.size: [{SIZE},{SIZE}] (model package)",
                 "video.mean: [0.5,0.5,0.5] (model package)",
                 "video.std: [0.25,0.25,0.25] (model package)",
                 '"shorter_side_crop" (default)'):
        assert line in r.stderr, (line, r.stderr[-2500:])
    settings = json.loads((tmp_path / "declared" / "index.json").read_text())["model_settings"]
    assert settings["video.size"]["source"] == "model package", settings
    # A rerun of the same command resumes: the package's settings are the same settings.
    r = run_precompute(binary, tmp_path, c)
    assert "3 of 3 samples are in committed shards; 0 to process" in r.stderr, r.stderr[-2000:]
    # The same vectors as a config that states them all.
    run_precompute(binary, tmp_path, config(manifest, tmp_path / "stated", models / "video.pt2"))
    assert np.array_equal(rows(tmp_path / "declared", "video"), rows(tmp_path / "stated", "video"))
    # The config file's own mean wins, and the log says the package differs.
    c = config(manifest, tmp_path / "own", models / "video.pt2", mean=[0.4, 0.4, 0.4])
    r = run_precompute(binary, tmp_path, c)
    assert ("video.mean is [0.4,0.4,0.4] in the config file and [0.5,0.5,0.5] in the model "
            "package") in r.stderr, r.stderr[-2500:]
    assert "video.mean: [0.4,0.4,0.4] (config file)" in r.stderr
    assert not np.array_equal(rows(tmp_path / "own", "video"), rows(tmp_path / "stated", "video"))


def test_packages_beside_a_config_in_a_folder_not_utf8_survive_a_decoder_crash_and_overwrite(
        binary, models, manifest, tmp_path):
    """Packages named relative to a config in a folder whose name is not UTF-8: a decoder that
    crashes on one clip fails that sample alone (the supervisor restarts the run, which loads the
    packages again), the other samples store what a clean run stores, a rerun with --overwrite
    does the same, and no unpacked copy is left in /tmp. A NUL in a package's path is refused,
    naming the key."""
    clean = tmp_path / "clean"
    run_precompute(binary, tmp_path, config(manifest, clean, models / "video.pt2",
                                            models / "audio.pt2"))
    folder = Path(os.fsdecode(os.fsencode(tmp_path) + b"/models-\xff\xfe"))
    folder.mkdir()
    for name in ("video.pt2", "audio.pt2"):
        shutil.copy(models / name, folder / name)
    c = config(manifest, Path("out"), Path("video.pt2"), Path("audio.pt2"))
    (folder / "config.yaml").write_text(json.dumps(c))
    before = unpacked_in_tmp()
    env = {**os.environ, "PRECOMPUTE_TEST_DECODER_FAULT": "crash:c1.mp4"}
    for flags in ([], ["--overwrite"]):
        r = subprocess.run([str(binary), "run", "--config", str(folder / "config.yaml"),
                            "--progress-interval", "0", "--max-failures", "1", *flags],
                           capture_output=True, env=env, timeout=600)
        log = r.stderr.decode("utf-8", "replace")
        assert r.returncode == 0, log[-3000:]
        assert "the run died (signal 11" in log, log[-3000:]
        out = read_output(folder / "out")
        assert sorted(out.samples) == ["s0", "s2"]  # s1: failure records only
        crashed = [f for f in out.failures if f["id"] == "s1"]
        assert crashed and {f["category"] for f in crashed} == {"crash"}, out.failures
        expected = read_output(clean)
        for sample in ("s0", "s2"):
            for modality in ("video", "audio"):
                np.testing.assert_array_equal(out.samples[sample][modality]["rows"],
                                              expected.samples[sample][modality]["rows"])
    assert unpacked_in_tmp() - before == set()

    nul = config(manifest, Path("out-nul"), Path("video\u0000.pt2"))
    (folder / "nul.yaml").write_text(json.dumps(nul))
    r = subprocess.run([str(binary), "run", "--config", str(folder / "nul.yaml")],
                       capture_output=True, timeout=120)
    log = r.stderr.decode("utf-8", "replace")
    assert r.returncode == 2, log[-2000:]
    assert "video.encoder.path" in log, log[-2000:]


def test_one_package_holds_a_build_per_dtype_and_each_run_takes_its_own(binary, manifest,
                                                                          tmp_path):
    """Note [Builds in one package]: float32 and bfloat16 builds in one file; video.dtype picks
    one, both store the float32 TorchScript's vectors (bfloat16 within its precision); a dtype
    with no build is refused at start-up naming the builds there are."""
    import copy
    import torch
    import export_encoders as demo
    from precompute.export import Build, InputSpec, build_name, package_builds
    video = demo.TinyFrameFeatures().eval()
    torch.jit.save(torch.jit.script(video), str(tmp_path / "video.pt"))
    half = copy.deepcopy(video).to(torch.bfloat16)
    both = package_builds(
        {build_name("cpu", "float32"): Build(video, [InputSpec((-1, 3, SIZE, SIZE))]),
         build_name("cpu", "bfloat16"): Build(half, [InputSpec((-1, 3, SIZE, SIZE), "bfloat16")])},
        tmp_path / "both.pt2", settings={"video": {"size": [SIZE, SIZE]}})
    with zipfile.ZipFile(both) as z:
        builds = {n.split("/")[3] for n in z.namelist() if "/data/aotinductor/" in n}
    assert builds == {"cpu_float32", "cpu_bfloat16"}
    run_precompute(binary, tmp_path, config(manifest, tmp_path / "ts", tmp_path / "video.pt"))
    reference = rows(tmp_path / "ts", "video")
    for dtype, least in (("float32", 0.9999), ("bfloat16", 0.99)):
        r = run_precompute(binary, tmp_path, config(manifest, tmp_path / dtype, both,
                                                    dtype=dtype))
        assert f"both.pt2: build cpu_{dtype} of 2" in r.stderr, r.stderr[-2000:]
        got = rows(tmp_path / dtype, "video")
        assert got.shape == reference.shape
        cos = (got * reference).sum(1) / (np.linalg.norm(got, axis=1) *
                                          np.linalg.norm(reference, axis=1))
        assert cos.min() >= least, (dtype, cos.min())
    r = run_precompute(binary, tmp_path, config(manifest, tmp_path / "f16", both,
                                                dtype="float16"), expect=2)
    assert ("holds the builds cpu_bfloat16, cpu_float32 and none named cpu_float16 for video on "
            "cpu in float16") in r.stderr, r.stderr[-2000:]
    out = tmp_path / "f16"
    assert not list(out.glob("*.h5")) and not (out / "index.json").exists()


@pytest.mark.parametrize("flag,value,message", [
    ("--device", "cpu,tpu", "--device 'cpu,tpu': 'tpu' is not one of cpu, cuda"),
    ("--dtype", "float32,", "--dtype 'float32,': '' is not one of float32, float16, bfloat16"),
    ("--dtype", "int8", "'int8' is not one of"),
    ("--device", "cpu,cuda", "--device cuda: this machine has no CUDA device"),
])
def test_export_refuses_a_device_or_dtype_it_cannot_build(tmp_path, flag, value, message):
    import torch
    from conftest import ROOT
    if "no CUDA device" in message and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    (tmp_path / "config.json").write_text("{}")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    r = subprocess.run([sys.executable, "-m", "precompute.export", "clip-vision", str(tmp_path),
                        str(tmp_path / "x.pt2"), flag, value], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 1 and message in r.stderr, r.stderr
