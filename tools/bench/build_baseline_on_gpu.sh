#!/usr/bin/env bash
# Builds an earlier commit of precompute on the GPU machine beside the working tree's build, so
# that one call can run before and after binaries in turn (text_scale.py and
# text_pipeline_ceiling.py take --binary more than once):
#
#   git archive -o .devbuild/baseline-COMMIT.tar COMMIT            # Debian machine, carried over
#   bash tools/bench/build_on_gpu.sh                               # GPU machine: FFmpeg, build-gpu
#   bash tools/bench/build_baseline_on_gpu.sh .devbuild/baseline-COMMIT.tar
#
# The tarball's tree is unpacked into $BASELINE_SRC (default /tmp/precompute-baseline-src) and
# built by its own tools/bench/build_on_gpu.sh into $BASELINE_BUILD (default build-gpu-baseline in
# this tree), with the same $WORK, so that it links the FFmpeg already built there.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
[ $# -eq 1 ] || { echo "usage: $0 TARBALL (from git archive)" >&2; exit 2; }
tarball=$(realpath "$1")
[ -s "$tarball" ] || { echo "build_baseline_on_gpu: $tarball is missing or empty" >&2; exit 2; }
src=${BASELINE_SRC:-/tmp/precompute-baseline-src}
build_dir=${BASELINE_BUILD:-$root/build-gpu-baseline}
rm -rf "$src"
mkdir -p "$src"
tar -xf "$tarball" -C "$src"
[ -f "$src/tools/bench/build_on_gpu.sh" ] ||
  { echo "build_baseline_on_gpu: $tarball holds no tools/bench/build_on_gpu.sh" >&2; exit 2; }
ln -sfn "$root/.devbuild" "$src/.devbuild"
echo "build_baseline_on_gpu: building $tarball into $build_dir"
BUILD_DIR=$build_dir bash "$src/tools/bench/build_on_gpu.sh"
