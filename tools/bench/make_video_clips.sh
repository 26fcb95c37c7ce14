#!/usr/bin/env bash
# Makes the video clips of the GPU video benchmark and the NVDEC parity test, with the ffmpeg CLI
# (Debian's; the GPU machine has none, so the clips are made here and carried there in
# bench-data/, which git ignores). Usage:
#
#   bash tools/bench/make_video_clips.sh SET [OUT]
#
# SET:
#   h264_720p   8 clips of 10 s, 1280x720, 30 fps, H.264 (x264 veryfast, crf 30, a keyframe every
#               2 s, B-frames), AAC audio: the clip set of the issue's table
#   hevc_1080p  2 clips of 60 s, 1920x1080, 30 fps, HEVC (x265 ultrafast, crf 32, default GOP)
#   long_720p   1 clip of 5 min, 1280x720, 30 fps, H.264 with x264's default GOP (keyint 250),
#               at most 450 kbit/s
#   parity      short clips for tests/gpu/nvdec_parity.py: 8-bit 4:2:0 untagged, BT.709, full
#               range, 10-bit HEVC, 4:4:4 (beyond NVDEC's H.264: must fall back), a rotated one,
#               VP9, MPEG-4 part 2
# OUT defaults to bench-data/SET. Existing clips are kept (idempotent). Content: FFmpeg's
# testsrc2 pattern, hue-shifted per clip, with temporal noise so that every frame costs what
# camera footage costs to code; a sine tone for audio.
set -euo pipefail
cd "$(dirname "$0")/../.."
set_name=${1:?usage: make_video_clips.sh h264_720p|hevc_1080p|long_720p|parity [OUT]}
out=${2:-bench-data/$set_name}
mkdir -p "$out"

# make NAME SECONDS SIZE RATE HUE -- ENCODER OPTIONS...
make() {
  local name=$1 seconds=$2 size=$3 rate=$4 hue=$5
  shift 6
  [ -s "$out/$name" ] && return 0
  ffmpeg -nostdin -hide_banner -loglevel error -y \
    -f lavfi -i "testsrc2=size=$size:rate=$rate,hue=h=$hue,noise=alls=4:allf=t" \
    -f lavfi -i "sine=frequency=$((220 + hue)):sample_rate=44100" -t "$seconds" \
    "$@" -shortest "$out/$name.partial.${name##*.}"
  mv "$out/$name.partial.${name##*.}" "$out/$name"
}

case $set_name in
  h264_720p)
    for i in 0 1 2 3 4 5 6 7; do
      make "clip$i.mp4" 10 1280x720 30 $((i * 15)) -- -c:v libx264 -preset veryfast -crf 30 -g 60 \
        -pix_fmt yuv420p -c:a aac -b:a 96k
    done ;;
  hevc_1080p)
    for i in 0 1; do
      make "clip$i.mp4" 60 1920x1080 30 $((i * 40)) -- -c:v libx265 -preset ultrafast -crf 32 \
        -x265-params log-level=error -tag:v hvc1 -pix_fmt yuv420p -c:a aac -b:a 64k
    done ;;
  long_720p)
    # One clip, its rate capped so that it travels to the GPU machine (under 20 MB).
    make "clip0.mp4" 300 1280x720 30 40 -- -c:v libx264 -preset veryfast -crf 32 \
      -maxrate 450k -bufsize 900k -pix_fmt yuv420p -c:a aac -b:a 32k ;;
  parity)
    make h264_420_untagged.mp4 2 640x360 25 0 -- -c:v libx264 -preset veryfast -pix_fmt yuv420p \
      -c:a aac
    make h264_bt709.mp4 2 1280x720 30 60 -- -c:v libx264 -preset veryfast -pix_fmt yuv420p \
      -colorspace bt709 -color_primaries bt709 -color_trc bt709 -color_range tv -c:a aac
    make h264_full_range.mp4 2 640x480 25 120 -- -c:v libx264 -preset veryfast \
      -pix_fmt yuvj420p -color_range pc -c:a aac
    make hevc_10bit.mp4 2 640x360 25 180 -- -c:v libx265 -preset ultrafast \
      -x265-params log-level=error -pix_fmt yuv420p10le -tag:v hvc1 -c:a aac
    make h264_444.mp4 2 640x360 25 240 -- -c:v libx264 -preset veryfast -pix_fmt yuv444p \
      -c:a aac
    # ffmpeg 5.1 writes the rotate tag as a display matrix only when it copies the stream.
    make h264_unrotated.tmp.mp4 2 640x360 25 300 -- -c:v libx264 -preset veryfast \
      -pix_fmt yuv420p -c:a aac
    [ -s "$out/h264_rotated.mp4" ] || ffmpeg -nostdin -hide_banner -loglevel error -y \
      -i "$out/h264_unrotated.tmp.mp4" -c copy -metadata:s:v:0 rotate=90 "$out/h264_rotated.mp4"
    rm -f "$out/h264_unrotated.tmp.mp4"
    make vp9.webm 2 640x360 25 30 -- -c:v libvpx-vp9 -deadline realtime -cpu-used 8 -b:v 1M \
      -pix_fmt yuv420p -c:a libopus
    make mpeg4.mp4 2 640x360 25 90 -- -c:v mpeg4 -q:v 4 -pix_fmt yuv420p -c:a aac ;;
  *)
    echo "make_video_clips: unknown set '$set_name'" >&2
    exit 2 ;;
esac
ls -l "$out"
du -sh "$out"
