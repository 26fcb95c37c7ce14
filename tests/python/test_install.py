"""`cmake --install`: the installed binary runs from its prefix, away from the build tree."""

import os
import shutil
import subprocess

from conftest import BUILD


def test_install_puts_a_working_binary_and_the_shared_files_under_the_prefix(binary, tmp_path):
    prefix = tmp_path / "prefix"
    r = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    installed = prefix / "bin" / "precompute"
    assert installed.is_file() and os.access(installed, os.X_OK)
    assert (prefix / "share" / "precompute" / "reference.yaml").is_file()
    assert os.access(prefix / "share" / "precompute" / "export_encoders.py", os.X_OK)
    # Run from elsewhere with a clean environment: nothing may come from the build tree's
    # RPATH or the caller's LD_LIBRARY_PATH.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    version = subprocess.run([str(installed), "--version"], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=60)
    assert version.returncode == 0, version.stderr
    built = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout == built.stdout
    ldd = subprocess.run(["ldd", str(installed)], capture_output=True, text=True, env=env)
    assert "not found" not in ldd.stdout, ldd.stdout
    assert str(BUILD) not in ldd.stdout, "the installed binary still loads from the build tree"
    shutil.rmtree(prefix)


def test_configure_refuses_ffmpeg_older_than_5_1(tmp_path):
    """FFmpeg 5.0's libraries (as pkg-config describes them) stop the configure step with the
    versions found and what to install, instead of failing later in the compiler."""
    from conftest import ROOT
    pc = tmp_path / "pc"
    pc.mkdir()
    old = {"libavformat": "59.16.100", "libavcodec": "59.18.100", "libavutil": "57.17.100",
           "libswscale": "6.4.100", "libswresample": "4.3.100"}
    for name, version in old.items():
        (pc / f"{name}.pc").write_text(
            f"prefix=/nonexistent\nName: {name}\nDescription: FFmpeg 5.0\nVersion: {version}\n"
            f"Libs: -L/nonexistent -l{name[3:]}\nCflags: -I/nonexistent\n")
    env = dict(os.environ, PKG_CONFIG_PATH=str(pc))
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), "-G", "Ninja",
                        "-DPRECOMPUTE_WITH_TORCH=OFF", "-DPRECOMPUTE_BUILD_TESTS=OFF"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0
    message = " ".join(r.stderr.split())  # CMake wraps long messages
    assert "precompute needs FFmpeg 5.1 or newer" in message, r.stderr[-3000:]
    assert "libavcodec 59.18.100" in message, r.stderr[-3000:]


def test_pip_install_of_the_reader_into_a_fresh_venv(binary, probes, minilm_folder, tmp_path):
    """`pip install ./python` as README gives it, into a new venv (no system site packages).
    The dependencies the package declares (numpy, h5py, torch) are made visible to that venv by
    a .pth file naming this project venv's site-packages, since downloading torch is no test's
    job: pip must find them satisfied by itself (no --no-deps) and download nothing but its
    isolated build's setuptools (from PyPI, as test_reader.py's install does). Then, from
    outside the repository, the installed copy (not python/ of the checkout) reads a real output
    through DataLoader workers."""
    import json
    import site
    import sys

    from conftest import ROOT, run_precompute, write_manifest
    venv = tmp_path / "fresh"
    r = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    fresh_site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    ours = [os.path.realpath(p) for p in site.getsitepackages()]
    assert os.path.realpath(fresh_site) not in ours
    # Before the .pth: a fresh venv really lacks the dependencies.
    r = subprocess.run([str(py), "-c", "import numpy"], capture_output=True, text=True)
    assert r.returncode != 0
    with open(os.path.join(fresh_site, "project-deps.pth"), "w") as f:
        f.write("\n".join(ours) + "\n")
    source = shutil.copytree(ROOT / "python", tmp_path / "python",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k.startswith(("PIP_", "HTTP", "http", "NO_PROXY",
                                                               "no_proxy", "SSL_", "REQUESTS_"))}
    env.update({"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
                "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    r = subprocess.run([str(py), "-m", "pip", "install", str(source)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for dep in ("numpy", "h5py", "torch"):
        assert f"Requirement already satisfied: {dep}" in r.stdout, r.stdout[-3000:]
    r = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    manifest = write_manifest(tmp_path / "m.jsonl",
                              [{"id": f"c{i}", "text": f"caption {i}"} for i in range(10)])
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(tmp_path / "out"), "shard_size": 4},
              "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")},
                       "pooling": "model",
                       "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}}}
    run_precompute(binary, tmp_path, config)
    script = (
        "import json, precompute, torch\n"
        "from torch.utils.data import DataLoader\n"
        f"data = precompute.ShardDataset({str(tmp_path / 'out')!r})\n"
        "ids = [i for b in DataLoader(data, batch_size=3, num_workers=2,\n"
        "                             collate_fn=precompute.collate) for i in b['id']]\n"
        "print(json.dumps({'file': precompute.__file__, 'ids': ids}))\n")
    r = subprocess.run([str(py), "-c", script], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["file"].startswith(fresh_site), got["file"]  # the installed copy
    assert got["ids"] == [f"c{i}" for i in range(10)]
