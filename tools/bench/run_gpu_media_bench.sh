#!/usr/bin/env bash
# The GPU audio and full-job benchmarks in one command: build precompute on the GPU machine
# (tools/bench/build_on_gpu.sh), build the FFmpeg 5.1 torchcodec loads (with libavfilter and
# libavdevice, which precompute's build leaves out), then tools/bench/audio_throughput.py (whole
# tracks, small conv encoder, against torchcodec's AudioDecoder) and tools/bench/multimodal_job.py
# (video + audio + text in one job, against torchcodec + DataLoader + the same models + h5py).
# Logs, JSON and markdown reports land in $OUT (default /tmp/out).
#
# Before, on the Debian machine:
#   bash tools/bench/fetch_gpu_deps.sh                # .devbuild/ (FFmpeg source, .debs, wheels
#                                                     # with torchcodec 0.17.0 for Python 3.12)
#   bash tools/bench/make_video_clips.sh h264_720p    # bench-data/h264_720p (AAC audio inside)
#   .venv/bin/python tools/bench/audio_throughput.py --make-media bench-data/audio
# Then on the GPU machine, from the repository root (the working tree, .devbuild/,
# bench-data/audio and bench-data/h264_720p copied there, about 50 MB):
#   STAGES="build peerffmpeg audio" bash tools/bench/run_gpu_media_bench.sh   # about 5 min
#   STAGES="job" bash tools/bench/run_gpu_media_bench.sh   # same warm machine, about 4-5 min
# (all four stages in one call come close to a 10-minute command limit: the build is ~3 min).
# STAGES picks the steps (default "build peerffmpeg audio job"); AUDIO_ARGS go to
# audio_throughput.py, JOB_ARGS to multimodal_job.py. A second call on a still-warm machine
# reuses both FFmpeg builds, the build folder and the installed wheels.
#
# Exit code: 1 when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
stages=${STAGES:-build peerffmpeg audio job}
python=${BENCH_PYTHON:-python3}
peer_ff=/tmp/precompute-peer-ffmpeg
started=$SECONDS
status=0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu.txt"

# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
if [[ " $stages " == *" build "* ]]; then
  gpu_build_stage || status=1
fi

if [[ " $stages " == *" peerffmpeg "* ]] && [ ! -f "$peer_ff/lib/libavfilter.so" ]; then
  # torchcodec 0.17 picks its core library by the FFmpeg major version it finds (5.1 here) and
  # links libavfilter and libavdevice as well. CPU decoding only: no NVDEC.
  echo "==== FFmpeg 5.1 for torchcodec (log: $OUT/peer-ffmpeg.log) ===="
  t0=$SECONDS
  (
    set -e
    src=/tmp/precompute-peer-ffmpeg-src
    rm -rf "$src" && mkdir -p "$src" /tmp/precompute-peer-nasm
    dpkg -x "$root"/.devbuild/nasm_*.deb /tmp/precompute-peer-nasm
    export PATH=/tmp/precompute-peer-nasm/usr/bin:$PATH
    tar xf "$root"/.devbuild/ffmpeg_5.1.9.orig.tar.xz -C "$src" --strip-components 1
    cd "$src"
    ./configure --prefix="$peer_ff" --disable-doc --disable-debug --disable-static \
      --enable-shared --disable-programs --disable-network --disable-autodetect \
      --enable-pthreads --disable-everything --enable-swscale --enable-swresample \
      --enable-avfilter --enable-avdevice --enable-protocol=file \
      --enable-demuxer=mov,matroska,avi,mpegts,wav,mp3,flac,ogg,aac \
      --enable-decoder=h264,hevc,vp9,vp8,mpeg4,aac,aac_fixed,mp3,mp3float,opus,vorbis,flac \
      --enable-decoder=pcm_s16le,pcm_s24le,pcm_s32le,pcm_f32le \
      --enable-parser=h264,hevc,vp9,vp8,mpeg4video,aac,opus,vorbis,flac,mpegaudio \
      --enable-bsf=h264_mp4toannexb,hevc_mp4toannexb,vp9_superframe_split,null \
      --enable-filter=buffer,buffersink,abuffer,abuffersink,null,anull,scale,format,aformat \
      --enable-filter=aresample,copy,crop,fps,setpts,asetpts \
      --enable-x86asm
    make -j"$(nproc)"
    make install
  ) > "$OUT/peer-ffmpeg.log" 2>&1 || { status=1; tail -n 20 "$OUT/peer-ffmpeg.log"; }
  echo "peer FFmpeg: $((SECONDS - t0)) s"
fi

# The wheels' packages for this Python (h5py, torchcodec, ...), each once per machine.
gpu_wheels_site
# The machine's own library path, for audio_throughput.py: its exports compile and load with
# the machine's libraries, and it gives the binary its own (precompute_run.binary_env).
machine_library_path=${LD_LIBRARY_PATH-}
# shellcheck disable=SC1091
[ -f build-gpu/precompute-env.sh ] && source build-gpu/precompute-env.sh
binary=build-gpu/tools/cli/precompute
# The peer's libraries: its FFmpeg, then torch's own and the CUDA wheels' (as
# /work/shared/bench/peers_video_gpu.sh sets them for torchcodec).
torch_libs=$("$python" -c 'import torch,os,glob; d=os.path.dirname(os.path.dirname(torch.__file__)); print(":".join([os.path.dirname(torch.__file__)+"/lib"]+sorted(set(os.path.dirname(x) for x in glob.glob(d+"/nvidia/**/lib*.so*", recursive=True)))))')
export PEER_LD_LIBRARY_PATH=$peer_ff/lib:$torch_libs
# What the peers can import: torchcodec with its FFmpeg (the peer's environment), torchaudio.
PYTHONPATH=$site LD_LIBRARY_PATH=$PEER_LD_LIBRARY_PATH "$python" -c 'import torch, torchcodec
from torchcodec.decoders import AudioDecoder, VideoDecoder
print("torchcodec", torchcodec.__version__, "torch", torch.__version__, "loads")' \
  > "$OUT/torchcodec-check.log" 2>&1 || { status=1; echo "torchcodec does not load"; }
"$python" -c 'import torchaudio; print("torchaudio", torchaudio.__version__)' \
  >> "$OUT/torchcodec-check.log" 2>&1 || echo "torchaudio: not installed" >> "$OUT/torchcodec-check.log"
tail -n 4 "$OUT/torchcodec-check.log"

if [[ " $stages " == *" audio "* ]]; then
  echo "==== audio throughput (log: $OUT/audio_throughput.log) ===="
  t0=$SECONDS
  # shellcheck disable=SC2086  # AUDIO_ARGS is a list of words
  LD_LIBRARY_PATH=$machine_library_path \
    "$python" tools/bench/audio_throughput.py --binary "$binary" --out "$OUT" \
    ${AUDIO_ARGS:-} 2>&1 | tee "$OUT/audio_throughput.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "audio: $((SECONDS - t0)) s"
fi

if [[ " $stages " == *" job "* ]]; then
  echo "==== full job, three modalities (log: $OUT/multimodal_job.log) ===="
  t0=$SECONDS
  # shellcheck disable=SC2086  # JOB_ARGS is a list of words
  "$python" tools/bench/multimodal_job.py --binary "$binary" --out "$OUT" \
    ${JOB_ARGS:-} 2>&1 | tee "$OUT/multimodal_job.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "job: $((SECONDS - t0)) s"
fi
echo "run_gpu_media_bench: exit $status after $((SECONDS - started)) s"
exit $status
