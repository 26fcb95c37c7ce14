#!/usr/bin/env python3
"""Pack a manifest's samples into WebDataset tar shards (KEY.mp4 / KEY.wav / KEY.txt / KEY.json
per sample, as video2dataset writes them), then let precompute read the shards in place:

    python examples/webdataset_shards.py build/demo/data/manifest.jsonl build/demo/shards
    build/tools/cli/precompute run --config configs/demo.yaml \\
        --input 'build/demo/shards/{000000..000003}.tar' --output build/demo/out-wds
    python examples/train_fusion.py build/demo/out-wds --epochs 5 --batch-size 16

The sample ids of the output are the shards' keys. Entries whose media file is missing are left
out of the shards (and said so). `--shards N` sets how many tars (default 4); samples go to them
in manifest order, as a dataset tool writes them.
"""

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

EXTENSIONS = {"video": ".mp4", "audio": ".wav"}


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest", type=Path, help="a JSONL manifest (id, video, audio, text)")
    p.add_argument("out", type=Path, help="folder for the tar shards")
    p.add_argument("--shards", type=int, default=4)
    args = p.parse_args()
    if args.shards < 1:
        p.error("--shards must be at least 1")
    base = args.manifest.resolve().parent
    entries, skipped = [], []
    for line in args.manifest.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        media = {k: base / entry[k] for k in EXTENSIONS if entry.get(k)}
        if not media or not all(path.is_file() for path in media.values()):
            skipped.append(str(entry.get("id")))
            continue
        entries.append((entry, media))
    if not entries:
        print(f"{args.manifest}: no entry with its media files", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(entries) // args.shards)
    for s in range(args.shards):
        with tarfile.open(args.out / f"{s:06d}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for entry, media in entries[s * per_shard:(s + 1) * per_shard]:
                key = str(entry["id"])
                for kind, path in media.items():
                    # The container keeps its own extension: it is what the member is.
                    tar.add(path, arcname=key + (path.suffix or EXTENSIONS[kind]))
                if entry.get("text"):
                    add_bytes(tar, f"{key}.txt", entry["text"].encode())
                extra = {k: v for k, v in entry.items() if k not in ("id", "video", "audio", "text")}
                add_bytes(tar, f"{key}.json", json.dumps(extra).encode())
    print(f"{len(entries)} samples in {args.shards} shards: "
          f"{args.out}/{{000000..{args.shards - 1:06d}}}.tar"
          + (f"; left out (media missing): {', '.join(skipped)}" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
