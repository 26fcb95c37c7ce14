#!/usr/bin/env bash
# Runs on a Debian 12 (bookworm) machine with network access, from anywhere in the repository.
# Fills .devbuild/ (git-ignored) with what the GPU machine lacks to build precompute, so that
# the folder can be carried there (tools/bench/build_on_gpu.sh uses it):
#   ffmpeg_5.1.9.orig.tar.xz           FFmpeg's source, from Debian's source package (orig only)
#   nasm_*.deb                         assembler for FFmpeg's x86 SIMD code
#   libffmpeg-nvenc-dev_*.deb          the ffnvcodec headers FFmpeg's NVDEC/CUVID code needs
#   libtbb-dev, libtbb12, libtbbmalloc2, libtbbbind-2-5 .debs   oneTBB headers, CMake package
#   libutf8proc-dev, libutf8proc2 .debs                         utf8proc header, pkg-config file
#   wheels/h5py-*.whl, wheels/pynvvideocodec-*.whl   for the GPU machine's Python 3.12: reading
#                                      shards (tests/gpu) and NVIDIA's decoder as the video peer
#                                      (tools/bench/video_throughput.py); PyPI, no dependencies
# Idempotent: files already present are kept. Prints the folder's size and fails above 60 MiB.
#
# The source download needs a deb-src entry. This script does not touch the machine's apt
# configuration: it runs `apt-get source` with a private sources file and a private lists folder
# (.cache/gpu-deps-apt/, git-ignored) and without the machine's package caches, so the system's
# own `apt-get` sees nothing new.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
dest=$root/.devbuild
ffmpeg_version=${FFMPEG_VERSION:-5.1.9}  # bookworm's (security) version
debs=(nasm libffmpeg-nvenc-dev libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
      libutf8proc-dev libutf8proc2 libgtest-dev)
mkdir -p "$dest"

# --- Debian binary packages (the machine's own bookworm lists) -------------------------------
missing=()
for p in "${debs[@]}"; do
  compgen -G "$dest/${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fetch_gpu_deps: downloading ${missing[*]}"
  (cd "$dest" && apt-get download -q "${missing[@]}")
fi
for p in "${debs[@]}"; do
  n=$(compgen -G "$dest/${p}_*.deb" | wc -l)
  if [ "$n" -ne 1 ]; then
    echo "fetch_gpu_deps: expected one ${p}_*.deb in $dest, found $n" >&2
    exit 1
  fi
done

# --- FFmpeg's source: only the upstream (orig) tarball ---------------------------------------
orig=ffmpeg_${ffmpeg_version}.orig.tar.xz
if [ ! -s "$dest/$orig" ]; then
  apt_dir=$root/.cache/gpu-deps-apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/download"
  cat > "$apt_dir/sources.list" <<'EOF'
deb-src http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm-updates main
deb-src http://deb.debian.org/debian-security bookworm-security main
EOF
  apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/no-parts"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache="
  )
  echo "fetch_gpu_deps: reading Debian's source lists into $apt_dir"
  apt-get "${apt_opts[@]}" update -q
  echo "fetch_gpu_deps: downloading the source of ffmpeg $ffmpeg_version"
  rm -f "$apt_dir/download/"*
  (cd "$apt_dir/download" && apt-get "${apt_opts[@]}" source --download-only -q ffmpeg)
  if [ ! -s "$apt_dir/download/$orig" ]; then
    echo "fetch_gpu_deps: $orig is not among the downloaded files (Debian's version moved on?" \
         "set FFMPEG_VERSION here and for build_on_gpu.sh):" >&2
    ls -l "$apt_dir/download" >&2
    exit 1
  fi
  # apt-get verified the tarball against the signed .dsc; only the tarball travels.
  mv "$apt_dir/download/$orig" "$dest/$orig.partial"
  mv "$dest/$orig.partial" "$dest/$orig"
  rm -f "$apt_dir/download/"*
fi
xz -t "$dest/$orig"

# --- Wheels for the GPU machine's Python (3.12, manylinux x86_64) ---------------------------
wheels=(h5py==3.16.0 pynvvideocodec==2.2.4 torchcodec==0.17.0)
pip_python=.venv/bin/python  # tools/setup.sh's venv has pip; Debian's python3 may not
[ -x "$pip_python" ] || pip_python=python3
mkdir -p "$dest/wheels"
for w in "${wheels[@]}"; do
  compgen -G "$dest/wheels/${w%%==*}-${w##*==}-*.whl" >/dev/null && continue
  echo "fetch_gpu_deps: downloading the wheel $w"
  "$pip_python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$dest/wheels" "$w"
done

ls -l "$dest"
bytes=$(du -sb "$dest" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "fetch_gpu_deps: .devbuild holds $mib MiB ($bytes bytes)"
if [ "$mib" -gt 60 ]; then
  echo "fetch_gpu_deps: .devbuild is over 60 MiB; the working tree carried to the GPU machine" \
       "must stay under 64 MiB" >&2
  exit 1
fi
