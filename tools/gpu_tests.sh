#!/usr/bin/env bash
# The tests that need a CUDA device, in one command on the GPU machine (from the repository root,
# with the working tree and .devbuild/ copied there; bench-data/parity too for the NVDEC test):
#
#   bash tools/gpu_tests.sh
#
# 1. builds precompute with tests/gpu (GPU_TESTS=1 bash tools/bench/build_on_gpu.sh);
# 2. writes a small BERT with random weights (transformers, no download) for the attention test;
# 3. runs the CTest label `gpu` (tests/gpu/gpu_test.cpp: flash attention against the padded path
#    and a float32 reference, two CUDA streams per encoder against one call at a time, the
#    allocator cap, NVDEC sessions) with PRECOMPUTE_REQUIRE_GPU=1, so that a missing device or
#    model fails; bench-data/hevc_1080p, when carried, gives the NVDEC handover test its clip;
# 4. runs tests/gpu/nvdec_parity.py on bench-data/parity (tools/bench/make_video_clips.sh parity)
#    when that folder is there, else says it did not;
# 5. runs tests/gpu/pt2_parity.py on the same clips: .pt2 encoders compiled for cuda;
# 6. runs tests/gpu/export_recipes_cuda.py: the audio and video export recipes compiled for
#    cuda in float32, float16 and bfloat16, run by precompute on cuda, against the recipes' own
#    modules run eagerly (audio) and the CPU package run by precompute on the CPU (video).
# Logs in $OUT (default /tmp/out). Exit 1 when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# The machine's own library path: the export check runs Python alone, without the FFmpeg and
# oneTBB libraries the binary is built against (precompute-env.sh puts them first).
machine_library_path=${LD_LIBRARY_PATH-}
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python=${BENCH_PYTHON:-python3}
status=0
started=$SECONDS

echo "==== build with tests/gpu (log: $OUT/build.log) ===="
if ! GPU_TESTS=1 bash tools/bench/build_on_gpu.sh > "$OUT/build.log" 2>&1; then
  tail -n 40 "$OUT/build.log"
  exit 1
fi
grep -E '^build_on_gpu: [0-9]\.' "$OUT/build.log"
# shellcheck disable=SC1091
source build-gpu/precompute-env.sh

# h5py for the NVDEC test, from the carried wheels, each once per machine.
# shellcheck source=tools/bench/gpu_build_stage.sh
. tools/bench/gpu_build_stage.sh
gpu_wheels_site

echo "==== a random BERT for the attention tests ===="
bert=/tmp/precompute-gpu-tests/bert
"$python" - "$bert" <<'PY' || status=1
import random, sys
from pathlib import Path
from transformers import BertConfig, BertModel
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
words = sorted({"".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(3000)})
vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
(out / "vocab.txt").write_text("\n".join(vocab) + "\n")
# head_dim 64 as BERT-base and MiniLM; 4 layers keep it quick.
cfg = BertConfig(vocab_size=len(vocab), hidden_size=384, num_hidden_layers=4,
                 num_attention_heads=6, intermediate_size=1536, max_position_embeddings=512)
BertModel(cfg).save_pretrained(out, safe_serialization=True)
print(f"{out}: vocab {len(vocab)}, hidden 384, 4 layers, 6 heads")
PY

echo "==== ctest -L gpu ===="
# The NVDEC handover test needs a clip far slower on the CPU than on NVDEC.
heavy=bench-data/hevc_1080p/clip0.mp4
if [ -f "$heavy" ]; then
  export PRECOMPUTE_TEST_HEAVY_CLIP=$PWD/$heavy
else
  echo "no $heavy (tools/bench/make_video_clips.sh hevc_1080p): the NVDEC handover test skips"
fi
PRECOMPUTE_REQUIRE_GPU=1 PRECOMPUTE_TEST_BERT_DIR=$bert \
  ctest --test-dir build-gpu -L gpu --output-on-failure 2>&1 | tee "$OUT/ctest_gpu.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "==== NVDEC parity ===="
if [ -d bench-data/parity ]; then
  "$python" tests/gpu/nvdec_parity.py --binary build-gpu/tools/cli/precompute \
    --clips bench-data/parity --work /tmp/nvdec-parity > "$OUT/nvdec_parity.log" 2>&1 || status=1
  grep -v '"ok": true' "$OUT/nvdec_parity.log" | tail -n 40
  echo "nvdec_parity: $(grep -c '"ok": true' "$OUT/nvdec_parity.log") checks passed"
else
  echo "NOT RUN: no bench-data/parity (bash tools/bench/make_video_clips.sh parity)"
  status=1
fi
echo "==== .pt2 encoders on cuda ===="
if [ -d bench-data/parity ]; then
  "$python" tests/gpu/pt2_parity.py --binary build-gpu/tools/cli/precompute \
    --clips bench-data/parity --work /tmp/pt2-parity > "$OUT/pt2_parity.log" 2>&1 || status=1
  grep -v '"ok": true' "$OUT/pt2_parity.log" | tail -n 40
  echo "pt2_parity: $(grep -c '"ok": true' "$OUT/pt2_parity.log") checks passed"
fi
echo "==== export recipes on cuda ===="
# The exporter compiles with the machine's libraries; the script runs the binary with its own.
LD_LIBRARY_PATH=$machine_library_path \
  "$python" tests/gpu/export_recipes_cuda.py --binary build-gpu/tools/cli/precompute \
  --clips bench-data/parity --work /tmp/export-cuda --dtypes float32,float16,bfloat16 --jobs 8 \
  > "$OUT/export_recipes_cuda.log" 2>&1 || status=1
grep -v '"ok": true' "$OUT/export_recipes_cuda.log" | grep '^{' | tail -n 20
echo "export_recipes_cuda: $(grep -c '"ok": true' "$OUT/export_recipes_cuda.log") checks passed"
echo "gpu_tests: exit $status in $((SECONDS - started)) s"
exit $status
