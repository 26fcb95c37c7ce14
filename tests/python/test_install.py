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
