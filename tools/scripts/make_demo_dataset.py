#!/usr/bin/env python3
"""Generates precompute's built-in demo dataset with the ffmpeg CLI and espeak-ng.

    make_demo_dataset.py OUTDIR

Writes 32 short clips (16 scenes from FFmpeg's lavfi sources, two clips each, in H.264/MP4,
VP9/WebM and MPEG-4/AVI at several sizes), each with espeak-ng reading its caption as the audio
track, plus two deliberately broken entries (a missing file and a corrupt file) so that the
demo shows failure records. OUTDIR/manifest.jsonl lists them; the two captions of a scene are
paraphrases of each other (tests use them as a semantic sanity check of the text encoder).
Idempotent: existing clips are kept.
"""

import argparse
import json
import subprocess
import sys
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# (lavfi source, caption A, caption B): B paraphrases A.
SCENES = [
    ("testsrc2", "A colourful test pattern with a moving counter.",
     "A bright test card with a running clock."),
    ("mandelbrot", "A zoom into a fractal with swirling colours.",
     "Colourful fractal shapes slowly magnified."),
    ("life=mold=10:ratio=0.3:death_color=#203040", "Cells of the game of life blinking on a grid.",
     "A cellular automaton evolving on a dark grid."),
    ("color=c=red", "A plain red screen.", "The whole picture is solid red."),
    ("smptebars", "Vertical colour bars used to calibrate televisions.",
     "Television calibration stripes in many colours."),
    ("cellauto=rule=90", "A cellular automaton drawing triangles line by line.",
     "Triangle patterns grow row after row."),
    ("rgbtestsrc", "Stripes of red, green and blue.", "Three bands of primary colours."),
    ("gradients", "A smooth colour gradient turning slowly.",
     "Soft colours blend into each other and rotate."),
    ("color=c=blue", "A calm empty blue background.", "An empty deep blue image."),
    ("testsrc", "A classic test pattern with a scrolling colour ramp.",
     "An old style test image with a moving rainbow."),
    ("pal75bars", "Colour bars at three quarter brightness.",
     "Test bars in muted colours."),
    ("color=c=green", "A green field filling the frame.", "The screen is entirely green."),
    ("sierpinski", "A Sierpinski fractal drifting across the screen.",
     "A moving triangle fractal pattern."),
    ("yuvtestsrc", "Colour test patches for checking video formats.",
     "Patches of colour that test a video format."),
    ("color=c=white", "A blank white frame.", "Nothing but white fills the picture."),
    ("smptehdbars", "High definition colour bars for broadcast alignment.",
     "Broadcast alignment bars in high definition."),
]

# (size, codec arguments, extension): cycled over the clips.
FORMATS = [
    ("320x240", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
                 "-c:a", "aac", "-b:a", "64k"], "mp4"),
    ("640x360", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "300k",
                 "-pix_fmt", "yuv420p", "-c:a", "libopus", "-b:a", "48k"], "webm"),
    ("480x480", ["-c:v", "mpeg4", "-q:v", "5", "-c:a", "mp3", "-b:a", "64k"], "avi"),
    ("1280x720", ["-c:v", "libx264", "-preset", "veryfast", "-pix_fmt", "yuv420p",
                  "-c:a", "aac", "-b:a", "64k"], "mp4"),
]


def run(cmd):
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.exit(f"command failed: {' '.join(cmd)}\n{result.stderr}")


def wav_seconds(path: Path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def make_clip(out: Path, index: int, source: str, caption: str) -> dict:
    size, codec, ext = FORMATS[index % len(FORMATS)]
    clip = out / "clips" / f"clip{index:02d}.{ext}"
    sample = {"id": f"clip{index:02d}", "video": str(clip.relative_to(out)), "text": caption}
    if clip.exists():
        return sample
    speech = out / "speech" / f"clip{index:02d}.wav"
    run(["espeak-ng", "-s", "150", "-w", str(speech), caption])
    seconds = round(wav_seconds(speech) + 0.5, 2)
    options = f"size={size}:rate=25"
    lavfi = f"{source}:{options}" if "=" in source else f"{source}={options}"
    tmp = clip.with_name(".tmp-" + clip.name)
    run(["ffmpeg", "-nostdin", "-y", "-hide_banner", "-loglevel", "error",
         "-f", "lavfi", "-i", lavfi, "-i", str(speech), "-af", "apad", "-t", str(seconds),
         *codec, str(tmp)])
    tmp.rename(clip)
    return sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    out = args.out.resolve()
    (out / "clips").mkdir(parents=True, exist_ok=True)
    (out / "speech").mkdir(parents=True, exist_ok=True)

    jobs = []
    for scene, (source, a, b) in enumerate(SCENES):
        jobs.append((2 * scene, source, a))
        jobs.append((2 * scene + 1, source, b))
    with ThreadPoolExecutor(max_workers=4) as pool:
        samples = list(pool.map(lambda j: make_clip(out, *j), jobs))

    corrupt = out / "clips" / "corrupt.mp4"
    corrupt.write_bytes(bytes(range(256)) * 64)
    samples.append({"id": "corrupt", "video": "clips/corrupt.mp4",
                    "text": "This file is not a video at all."})
    samples.append({"id": "missing", "video": "clips/does-not-exist.mp4",
                    "text": "This clip was never recorded."})

    with open(out / "manifest.jsonl", "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    print(f"demo dataset: {len(samples)} samples in {out / 'manifest.jsonl'}")


if __name__ == "__main__":
    main()
