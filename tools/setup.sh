#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for precompute: Debian packages, the project venv
# (.venv, pinned python/requirements.txt, LibTorch comes with its torch wheel), then configure and
# build into build/. Every step is skipped when already done, so the other scripts call it first.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS

apt_packages=(
  build-essential cmake ninja-build pkg-config python3-venv
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libswresample-dev
  libhdf5-dev libtbb-dev libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev
  nlohmann-json3-dev libgtest-dev libutf8proc-dev
  libffmpeg-nvenc-dev  # NVDEC engine count (Note [Two sessions per engine]), CUDA builds only
  ffmpeg espeak-ng hdf5-tools
  clang-14 libclang-rt-14-dev llvm-14  # tools/test_sanitized.sh: ASan, UBSan, libFuzzer, symbolizer
  slurmctld slurmd slurm-client munge  # tests/python/test_slurm.py: a one-host SLURM cluster
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  echo "setup: Debian packages installed in $((SECONDS - started)) s"
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(sha256sum python/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing python/requirements.txt into .venv (torch brings LibTorch)"
  pip_started=$SECONDS
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r python/requirements.txt
  echo "$want" > "$stamp"
  echo "setup: Python packages installed in $((SECONDS - pip_started)) s"
fi

if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPRECOMPUTE_PYTHON="$PWD/.venv/bin/python"
fi
build_started=$SECONDS
cmake --build build
echo "setup: build up to date in $((SECONDS - build_started)) s; set-up took $((SECONDS - started)) s"
