#!/usr/bin/env bash
# The built-in demo: set-up, then 32 generated clips with speech and captions (plus two broken
# entries) embedded by small video/audio encoders and the real all-MiniLM-L6-v2 (native BERT), into
# build/demo/out; then `precompute inspect` and how to load the result in Python.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
[ -e build/demo/models/all-MiniLM-L6-v2/config.json ] && [ -f build/demo/models/audio_demo.pt ] ||
  .venv/bin/python tools/scripts/export_encoders.py demo build/demo/models
.venv/bin/python tools/scripts/make_demo_dataset.py build/demo/data
build/tools/cli/precompute run --config configs/demo.yaml
build/tools/cli/precompute inspect build/demo/out
cat <<'PY'

Load the shards in Python (h5py; schema in docs/format.md):
  import h5py, glob
  for path in sorted(glob.glob("build/demo/out/shard-*.h5")):
      with h5py.File(path) as f:
          ids, text = f["ids"].asstr()[:], f["text/embeddings"][:]     # [N, 384] float16
          print(path, len(ids), text.shape, f["video/offsets"][:3])    # per-frame video rows
PY
