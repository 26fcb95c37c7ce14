# shellcheck shell=bash
# Sourced by the GPU benchmark wrappers (run_gpu_*_bench.sh), from the repository root:
# gpu_build_stage runs tools/bench/build_on_gpu.sh with its log in $OUT/build.log, shows its
# step lines and how long it took, and returns 1 when the build failed.
gpu_build_stage() {
  echo "==== build (log: $OUT/build.log) ===="
  local t0=$SECONDS rc=0
  bash tools/bench/build_on_gpu.sh > "$OUT/build.log" 2>&1 || rc=1
  grep -E '^build_on_gpu: ' "$OUT/build.log" | tail -n 12
  echo "build: $((SECONDS - t0)) s"
  return "$rc"
}

# gpu_wheels_site installs each wheel of .devbuild/wheels/ that is not yet installed into the
# shared site folder /tmp/precompute-bench-site (a later call on a warm machine may carry a wheel
# the first did not, e.g. PyNvVideoCodec for the video peer), puts that folder on PYTHONPATH and
# sets `site` to it. pip's log goes to $OUT/pip.log.
gpu_wheels_site() {
  site=/tmp/precompute-bench-site
  local wheel marker
  mkdir -p "$site"
  for wheel in .devbuild/wheels/*.whl; do
    [ -f "$wheel" ] || continue
    marker="$site/.installed-$(basename "$wheel")"
    [ -f "$marker" ] && continue
    if "${python:-python3}" -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        --upgrade "$wheel" >> "$OUT/pip.log" 2>&1; then
      touch "$marker"
    else
      echo "pip install $wheel failed"; tail -n 20 "$OUT/pip.log"
    fi
  done
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}
