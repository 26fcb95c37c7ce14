#!/usr/bin/env bash
# Seed corpora of the fuzz targets, made at test time (no binary is committed):
#   OUT/manifest/  a few valid and nearly valid manifest lines in JSONL, CSV and TSV
#   OUT/media/     tiny clips (a few KB) from FFmpeg's lavfi sources, one per container and codec
#                  family the decoders accept, so that mutations start from every demuxer
#   OUT/tar/       small tar shards in GNU, PAX and ustar formats: long names, a link, a folder
# plus the inputs that once found bugs, so that every run checks them first.
# Usage: tests/fuzz/make_seeds.sh OUT
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT}
mkdir -p "$out/manifest" "$out/media" "$out/tar"
out=$(cd "$out" && pwd)  # the steps below change folders

m="$out/manifest"
printf '%s\n' '{"id": "a", "video": "v/a.mp4", "text": "A dog catches a frisbee."}' \
  '{"id": 7, "audio": "/abs/b.wav"}' '{"id": "c", "text": ""}' > "$m/plain.jsonl"
printf '\xEF\xBB\xBF{"id": "x", "video": null, "text": "caf\xC3\xA9"}\r\n\n  \n{"id": "x", "text": "dup"}\n' \
  > "$m/bom_dup.jsonl"
printf 'id,video,audio,text\r\na,a.mp4,,"quoted, with comma"\r\nb,,b.wav,"two\nlines ""q"""\r\n' \
  > "$m/quoted.csv"
printf 'ID\ttext\textra\nt1\thello\tx\nt2\t"tab\tinside"\ty\n' > "$m/upper.tsv"
printf 'id,text\na,"never closed\n' > "$m/unclosed.csv"
# Kept values of every JSON kind, as written (the fuzzer keeps "label"), and repeated keys.
printf '%s\n' '{"id": "a", "text": "x", "label": [ 1 ,{"k": 1, "k": 2}, "]}\"\\" ]}' \
  '{"id":"b","text":"x","label":-0}' '{"id":"c","text":"x","\u006cabel":1E5,"n":null}' \
  '{"id": "d", "text": "x", "label": "caf\u00e9"}' '{"id": "e", "text": "x", "label" :{ } }' \
  > "$m/kept_values.jsonl"
printf '%s\n' '{"id": "a", "text": "x", "label": 1}' \
  '{"id": "b", "text": "y", "label": 1, "\u006cabel": 2}' > "$m/repeated_key.jsonl"
# Regressions: inputs the fuzzer once crashed on, checked first on every run.
printf '{"id": "a", "text": "x", "n": 1e999}\n' > "$m/number_overflow.jsonl"
printf 'id,video,video,text\na,x.mp4,hello\n' > "$m/duplicate_column.csv"

ff() { ffmpeg -nostdin -y -hide_banner -loglevel error "$@"; }
v="testsrc2=size=16x16:rate=5"
a="sine=frequency=440:sample_rate=8000"
d=0.4
cd "$out/media"
ff -f lavfi -i "$v:duration=$d" -f lavfi -i "$a:duration=$d" -c:v libx264 -preset ultrafast \
  -pix_fmt yuv420p -c:a aac -b:a 8k -ac 1 h264_aac.mp4
ff -f lavfi -i "$v:duration=$d" -c:v mpeg4 -q:v 31 -movflags +faststart mpeg4.mov
ff -f lavfi -i "$v:duration=$d" -c:v mpeg4 -q:v 31 mpeg4.avi
ff -f lavfi -i "$v:duration=$d" -f lavfi -i "$a:duration=$d" -c:v mjpeg -q:v 31 -c:a pcm_u8 \
  mjpeg_pcm.mkv
ff -f lavfi -i "$v:duration=$d" -f lavfi -i "$a:duration=$d" -c:v libvpx -b:v 20k \
  -c:a libopus -b:a 6k vp8_opus.webm
ff -f lavfi -i "$v:duration=$d" -c:v mpeg2video -q:v 31 -f mpegts mpeg2.ts
ff -f lavfi -i "$a:duration=0.1" -c:a pcm_s16le s16.wav
# The FLAC muxer pads its header to 8 KB whatever the length; the fuzzer's -max_len follows.
ff -f lavfi -i "$a:duration=0.05" -c:a flac -compression_level 0 sine.flac
ff -f lavfi -i "$a:duration=0.2" -c:a libmp3lame -b:a 8k sine.mp3
ff -f lavfi -i "anullsrc=channel_layout=stereo:sample_rate=8000:duration=0.2" -c:a libvorbis \
  stereo.ogg
# Regression: the WAV above claiming 536,878,912 Hz (one header byte changed), which once made
# libswresample take 30 s and 1.3 GB to set up.
cp s16.wav huge_rate.wav
printf '\x20' | dd of=huge_rate.wav bs=1 seek=27 conv=notrunc status=none

# Tar shards: the three header formats, a name over 100 bytes (GNU 'L' and PAX 'x' records, a
# ustar prefix), a symbolic link and a folder member.
t=$(mktemp -d)
mkdir -p "$t/d/$(printf 'n%.0s' $(seq 1 60))/$(printf 'm%.0s' $(seq 1 50))"
long="d/$(printf 'n%.0s' $(seq 1 60))/$(printf 'm%.0s' $(seq 1 50))/k.mp4"
printf 'caption one\n' > "$t/a.txt"
printf 'not a video' > "$t/a.mp4"
printf '{"i": 1}' > "$t/a.json"
printf 'x' > "$t/$long"
ln -s a.mp4 "$t/b.mp4"
for format in gnu pax ustar; do
  tar -C "$t" --format=$format -cf "$out/tar/$format.tar" a.txt a.mp4 a.json b.mp4 d
done
rm -rf "$t"

