#!/usr/bin/env bash
# Builds precompute on the GPU machine (Ubuntu 24.04, no FFmpeg, oneTBB or utf8proc dev files,
# no network) from the working tree plus the carried .devbuild/ folder that
# tools/bench/fetch_gpu_deps.sh fills. Run from anywhere in the repository:
#
#   bash tools/bench/build_on_gpu.sh
#
# Steps, each timed, each failing loudly with its log's tail:
#   1. unpack the .debs (dpkg -x, never into /) into $WORK/deps and point their pkg-config
#      files at that prefix (their CMake files compute their prefix from their own location);
#   2. build a minimal shared FFmpeg 5.1 (containers, codecs and parsers precompute reads,
#      swscale, swresample, the file protocol, NVDEC/CUVID) into $WORK/ffmpeg, with an rpath so
#      its libraries find each other; skipped when the same build is already installed;
#   3. configure precompute (Release, no tests) against those prefixes and LibTorch of
#      $PRECOMPUTE_PYTHON, and check that CMake took FFmpeg, oneTBB and utf8proc from them;
#   4. build with every core, check with ldd that the binary loads the prefixes' libraries, and
#      write $BUILD_DIR/precompute-env.sh (LD_LIBRARY_PATH) for the scripts that run it.
#
# Environment (all optional):
#   PRECOMPUTE_PYTHON  Python whose torch provides LibTorch (default: /opt/torch/.venv/bin/python
#                      when it imports torch, else `command -v python3`)
#   PRECOMPUTE_CUDA    ON, OFF or AUTO (default: ON when nvcc is found, else AUTO)
#   BUILD_DIR          precompute's build folder (default: build-gpu)
#   WORK               prefixes, FFmpeg's build and the logs (default: /tmp/precompute-gpu)
#   JOBS               parallel jobs (default: nproc)
#   FFMPEG_VERSION     the version of .devbuild/ffmpeg_VERSION.orig.tar.xz (default: 5.1.9)
#   GPU_TESTS          1: also build tests/gpu (GoogleTest from the unpacked libgtest-dev), which
#                      tools/gpu_tests.sh runs
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
devbuild=$root/.devbuild
work=${WORK:-/tmp/precompute-gpu}
deps=$work/deps
ff_prefix=$work/ffmpeg
ff_version=${FFMPEG_VERSION:-5.1.9}
build_dir=${BUILD_DIR:-build-gpu}
case $build_dir in /*) ;; *) build_dir=$root/$build_dir ;; esac
jobs=${JOBS:-$(nproc)}
logs=$work/logs
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)
started=$SECONDS

say() { echo "build_on_gpu: $*"; }
die() { echo "build_on_gpu: ERROR: $*" >&2; exit 1; }

# run_logged NAME CMD...: runs CMD with its output in $logs/NAME.log; on failure prints the
# log's tail (and copies the logs to $OUT/build-logs when OUT is set) and exits.
run_logged() {
  local name=$1 t0=$SECONDS
  shift
  if ! "$@" >"$logs/$name.log" 2>&1; then
    echo "build_on_gpu: ERROR: step '$name' failed after $((SECONDS - t0)) s: $*" >&2
    echo "---- last 60 lines of $logs/$name.log ----" >&2
    tail -n 60 "$logs/$name.log" >&2
    echo "---- end of $logs/$name.log ----" >&2
    if [ -n "${OUT:-}" ]; then
      { mkdir -p "$OUT/build-logs" && cp "$logs"/*.log "$OUT/build-logs/"; } || true
    fi
    exit 1
  fi
  say "$name: $((SECONDS - t0)) s"
}

# --- 0. what this needs ------------------------------------------------------------------------
for tool in cmake make gcc g++ pkg-config dpkg tar xz; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed"
done
[ -d "$devbuild" ] || die "$devbuild is missing: run tools/bench/fetch_gpu_deps.sh on a Debian" \
                          "machine and carry .devbuild to this one"
[ -s "$devbuild/ffmpeg_${ff_version}.orig.tar.xz" ] ||
  die "$devbuild/ffmpeg_${ff_version}.orig.tar.xz is missing (run tools/bench/fetch_gpu_deps.sh)"
debs=(nasm libffmpeg-nvenc-dev libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
      libutf8proc-dev libutf8proc2 libgtest-dev)
for p in "${debs[@]}"; do
  compgen -G "$devbuild/${p}_*.deb" >/dev/null || die "$devbuild/${p}_*.deb is missing"
done

if [ -z "${PRECOMPUTE_PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python ] &&
     /opt/torch/.venv/bin/python -c "import torch" >/dev/null 2>&1; then
    PRECOMPUTE_PYTHON=/opt/torch/.venv/bin/python
  else
    PRECOMPUTE_PYTHON=$(command -v python3) || die "no python3"
  fi
fi
torch_info=$("$PRECOMPUTE_PYTHON" -c "import torch; print(torch.__version__, torch.version.cuda)") ||
  die "$PRECOMPUTE_PYTHON cannot import torch; set PRECOMPUTE_PYTHON"
nvcc=""
for c in "${CUDACXX:-}" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done
cuda_mode=${PRECOMPUTE_CUDA:-$([ -n "$nvcc" ] && echo ON || echo AUTO)}
mkdir -p "$work" "$logs"
say "repo $root, work $work, build $build_dir, $jobs jobs, arch $arch"
say "python $PRECOMPUTE_PYTHON (torch $torch_info), nvcc ${nvcc:-none}, PRECOMPUTE_CUDA=$cuda_mode"
say "cmake $(cmake --version | head -1 | awk '{print $3}'), gcc $(gcc -dumpfullversion)"

# --- 1. the .debs into a prefix ----------------------------------------------------------------
t0=$SECONDS
rm -rf "$deps"
mkdir -p "$deps"
for p in "${debs[@]}"; do
  dpkg -x "$(compgen -G "$devbuild/${p}_*.deb")" "$deps"
done
# pkg-config files: prefix=/usr -> the unpacked prefix; so too libdir and includedir where a
# package spells them out (gtest's).
pc_files=$(find "$deps" -name '*.pc')
[ -n "$pc_files" ] || die "no pkg-config files in $deps"
for pc in $pc_files; do
  sed -i -e "s|^prefix=.*|prefix=$deps/usr|" -e "s|^\([a-z_]*dir\)=/usr/|\1=$deps/usr/|" "$pc"
  if grep -nE '^[a-z_]+=/usr' "$pc"; then die "$pc still names a path under /usr"; fi
done
# Absolute symlinks would point back into this machine's /usr: rewrite them into the prefix.
while IFS= read -r link; do
  target=$(readlink "$link")
  ln -sfn "$deps$target" "$link"
done < <(find "$deps" -type l -lname '/*')
# oneTBB's CMake package computes its prefix from its own path; check that nothing else is
# hard-coded.
tbb_dir=$deps/usr/lib/$arch/cmake/TBB
[ -f "$tbb_dir/TBBConfig.cmake" ] || die "no TBBConfig.cmake under $tbb_dir"
if grep -n '"/usr/\(lib\|include\)' "$tbb_dir"/*.cmake | grep -v '_realOrig\|set(_IMPORT_PREFIX'; then
  die "oneTBB's CMake files name absolute /usr paths"
fi
export PATH=$deps/usr/bin:$PATH
nasm -v >/dev/null || die "the unpacked nasm does not run"
export PKG_CONFIG_PATH=$ff_prefix/lib/pkgconfig:$deps/usr/lib/$arch/pkgconfig:$deps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
for m in ffnvcodec libutf8proc tbb; do
  v=$(pkg-config --modversion "$m") || die "pkg-config cannot find $m in the prefix"
  say "  $m $v from $(pkg-config --variable=prefix "$m")"
done
say "1. unpacked ${#debs[@]} .debs into $deps: $((SECONDS - t0)) s"

# --- 2. FFmpeg ---------------------------------------------------------------------------------
# shellcheck disable=SC2054  # commas separate FFmpeg component names, not array elements
ff_config=(
  --prefix="$ff_prefix" --enable-shared --disable-static --enable-rpath
  --disable-doc --disable-debug --disable-programs --disable-avdevice --disable-avfilter
  --disable-postproc --disable-network --disable-autodetect --enable-pthreads
  --disable-everything
  --enable-swscale --enable-swresample
  --enable-protocol=file
  --enable-demuxer=mov,matroska,avi,mpegts,wav,mp3,flac,ogg,aac
  --enable-decoder=h264,hevc,vp9,vp8,mpeg4,aac,aac_fixed,mp3,mp3float,opus,vorbis,flac
  --enable-decoder=pcm_s16le,pcm_s16be,pcm_s24le,pcm_s32le,pcm_f32le,pcm_f64le,pcm_u8
  --enable-decoder=pcm_alaw,pcm_mulaw
  --enable-parser=h264,hevc,vp9,vp8,mpeg4video,aac,aac_latm,opus,vorbis,flac,mpegaudio
  --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,vp9_superframe_split,null
  --enable-ffnvcodec --enable-cuda --enable-nvdec --enable-cuvid
  --enable-hwaccel=h264_nvdec,hevc_nvdec,vp9_nvdec,vp8_nvdec,mpeg4_nvdec
  --enable-decoder=h264_cuvid,hevc_cuvid,vp9_cuvid,vp8_cuvid,mpeg4_cuvid
  --enable-x86asm
)
# zlib (compressed MP4 headers, Matroska zlib tracks) when its header is there; nothing else is
# auto-detected, so the build is the same wherever it runs.
if echo '#include <zlib.h>' | gcc -E - >/dev/null 2>&1; then ff_config+=(--enable-zlib); fi
ff_stamp_want=$(printf '%s\n' "$ff_version" "${ff_config[@]}" "$(nasm -v)" "$(gcc -dumpfullversion)" |
                sha256sum | cut -d' ' -f1)
if [ "$(cat "$ff_prefix/.stamp" 2>/dev/null)" = "$ff_stamp_want" ] &&
   [ -f "$ff_prefix/lib/pkgconfig/libavformat.pc" ]; then
  say "2. FFmpeg $ff_version already built in $ff_prefix (delete it to rebuild)"
else
  t0=$SECONDS
  rm -rf "$work/ffmpeg-src" "$ff_prefix"
  mkdir -p "$work/ffmpeg-src"
  tar -xJf "$devbuild/ffmpeg_${ff_version}.orig.tar.xz" -C "$work/ffmpeg-src" --strip-components=1
  cd "$work/ffmpeg-src"
  run_logged ffmpeg-configure ./configure "${ff_config[@]}"
  for feature in NVDEC CUVID CUDA FFNVCODEC X86ASM PTHREADS SWSCALE SWRESAMPLE H264_DECODER \
                 MOV_DEMUXER MATROSKA_DEMUXER FILE_PROTOCOL H264_NVDEC_HWACCEL H264_CUVID_DECODER; do
    # FFmpeg 5.1 lists components (decoders, demuxers, ...) in config_components.h.
    grep -qh "^#define CONFIG_$feature 1\|^#define HAVE_$feature 1" config.h config_components.h ||
      die "FFmpeg's configure left $feature out (see $logs/ffmpeg-configure.log)"
  done
  run_logged ffmpeg-make make -j"$jobs"
  run_logged ffmpeg-install make install
  cd "$root"
  echo "$ff_stamp_want" > "$ff_prefix/.stamp"
  rm -rf "$work/ffmpeg-src"
  say "2. FFmpeg $ff_version built into $ff_prefix: $((SECONDS - t0)) s"
fi
say "  libavformat $(pkg-config --modversion libavformat) from" \
    "$(pkg-config --variable=prefix libavformat)"

# --- 3. configure precompute -------------------------------------------------------------------
t0=$SECONDS
generator=()
if command -v ninja >/dev/null; then
  # Keep the generator of an existing build folder (CMake refuses to switch).
  if [ ! -f "$build_dir/CMakeCache.txt" ] || grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' \
       "$build_dir/CMakeCache.txt"; then
    generator=(-G Ninja)
  fi
fi
# The GPU tests only (GPU_TESTS=1): the CPU suites need the ffmpeg CLI, which this machine lacks.
build_tests=OFF
targets=()
if [ "${GPU_TESTS:-0}" = 1 ]; then
  build_tests=ON
  targets=(--target precompute decode_bench attention_bench gpu_tests)
fi
cmake_args=(
  -S "$root" -B "$build_dir" "${generator[@]}"
  -DCMAKE_BUILD_TYPE=Release
  -DPRECOMPUTE_BUILD_TESTS="$build_tests"
  -DPRECOMPUTE_PYTHON="$PRECOMPUTE_PYTHON"
  -DPRECOMPUTE_CUDA="$cuda_mode"
  "-DCMAKE_PREFIX_PATH=$ff_prefix;$deps/usr"
  -DTBB_DIR="$tbb_dir"
  -DGTest_DIR="$deps/usr/lib/$arch/cmake/GTest"
)
# CMake 4 refuses packages that still declare compatibility with CMake < 3.5.
if [ "$(cmake --version | head -1 | awk '{print $3}' | cut -d. -f1)" -ge 4 ]; then
  cmake_args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
fi
if [ -n "$nvcc" ] && [ "$cuda_mode" != OFF ]; then
  # LibTorch's package takes the architectures from TORCH_CUDA_ARCH_LIST (our CMake sets 9.0).
  cmake_args+=(-DCMAKE_CUDA_COMPILER="$nvcc")
  PATH=$(dirname "$nvcc"):$PATH
fi
run_logged cmake-configure cmake "${cmake_args[@]}"
grep -E "precompute: LibTorch" "$logs/cmake-configure.log" || true
if [ "$cuda_mode" = ON ] && ! grep -q "precompute: LibTorch.*CUDA: ON" "$logs/cmake-configure.log"
then
  die "PRECOMPUTE_CUDA=ON but the configure log does not say 'CUDA: ON' (see" \
      "$logs/cmake-configure.log)"
fi
# What CMake took: every FFmpeg, oneTBB and utf8proc file must come from the prefixes.
cache=$build_dir/CMakeCache.txt
check_cache() { # REGEX PREFIX: every matching cache entry's value must start with PREFIX
  local lines bad
  lines=$(grep -E "$1" "$cache" || true)
  [ -n "$lines" ] || die "no CMake cache entry matches '$1' in $cache"
  bad=$(echo "$lines" | tr ';' '\n' | sed 's/^[^=]*=//' | grep -v "^$2" | grep -v '^$' || true)
  if [ -n "$bad" ]; then
    die "CMake took these outside $2 (for '$1'):"$'\n'"$bad"
  fi
  echo "$lines" | sed 's/^/    /'
}
say "  CMake's choices:"
check_cache '^pkgcfg_lib_FFMPEG_(avformat|avcodec|avutil|swscale|swresample):' "$ff_prefix/lib/"
check_cache '^FFMPEG_INCLUDE_DIRS:' "$ff_prefix/include"
check_cache '^pkgcfg_lib_UTF8PROC_utf8proc:' "$deps/usr/lib/"
check_cache '^UTF8PROC_INCLUDE_DIRS:' "$deps/usr/include"
check_cache '^TBB_DIR:' "$tbb_dir"
say "3. configured $build_dir: $((SECONDS - t0)) s"

# --- 4. build ----------------------------------------------------------------------------------
t0=$SECONDS
run_logged cmake-build cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
binary=$build_dir/tools/cli/precompute
[ -x "$binary" ] || die "$binary was not built"
env_file=$build_dir/precompute-env.sh
cat > "$env_file" <<EOF
# Written by tools/bench/build_on_gpu.sh: source it before running $binary.
export LD_LIBRARY_PATH=$ff_prefix/lib:$deps/usr/lib/$arch\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PRECOMPUTE_BINARY=$binary
EOF
# shellcheck source=/dev/null
. "$env_file"
ldd_out=$(ldd "$binary")
if echo "$ldd_out" | grep -q "not found"; then
  echo "$ldd_out" | grep "not found" >&2
  die "$binary has unresolved libraries"
fi
say "  libraries of $binary:"
echo "$ldd_out" | grep -E 'libav|libsw|tbb|utf8proc|libtorch\.so|libc10_cuda|hdf5' | sed 's/^\s*/    /'
bad=$(echo "$ldd_out" | grep -E 'libav|libsw|tbb|utf8proc' | grep -vE "=> ($ff_prefix|$deps)/" || true)
[ -z "$bad" ] || die "these load from outside the prefixes:"$'\n'"$bad"
"$binary" --help >/dev/null || die "$binary --help failed"
# Note [LibTorch exports std::filesystem] in cmake/PrecomputeCompilerOptions.cmake.
torch_bound=$(LD_BIND_NOW=1 LD_DEBUG=bindings "$binary" --version 2>&1 |
  grep "binding file $binary .*filesystem" | grep -c "libtorch" || true)
say "  std::filesystem symbols of $binary bound to LibTorch's copies: $torch_bound (first" \
  "DT_NEEDED: $(readelf -d "$binary" | grep -m1 NEEDED | awk '{print $5}'))"
if [ "$torch_bound" != 0 ]; then
  # Should it come back: the libraries the binary names, and the link line that named them
  # (written to the log, its libstdc++ and as-needed parts shown).
  say "  DT_NEEDED of $binary: $(readelf -d "$binary" | awk '/NEEDED/ {printf "%s ", $5}')"
  if [ -f "$build_dir/build.ninja" ]; then
    link_line=$(ninja -C "$build_dir" -t commands tools/cli/precompute 2>/dev/null | tail -n 1)
    echo "$link_line" > "$logs/precompute-link-line.txt"
    say "  link line ($logs/precompute-link-line.txt): driver $(echo "$link_line" |
      awk '{print $1; exit}' | sed 's/^: && //'); its libstdc++/as-needed/state words:" \
      "$(echo "$link_line" | tr ' ' '\n' | grep -nE 'stdc|as-needed|state|Xlinker' | tr '\n' ' ')"
  fi
  die "$binary would call LibTorch's std::filesystem (remove_all jumps to address 0)"
fi
say "4. built $binary: $((SECONDS - t0)) s"
say "done in $((SECONDS - started)) s; before running it: . $env_file"
