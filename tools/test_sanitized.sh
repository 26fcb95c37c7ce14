#!/usr/bin/env bash
# The sanitizer half of the tests (tools/test.sh runs it last). A second build tree, build-asan/,
# compiled by clang with AddressSanitizer (leaks included) and UndefinedBehaviorSanitizer, and
# without LibTorch (PRECOMPUTE_WITH_TORCH=OFF: LibTorch is not built with ASan, so the encoders,
# the runner, the CLI and the pytest suite that drives it stay out; the stages and the oneTBB
# graph are in, run by tests/unit/graph_test.cpp with fake encoders). In it: every GoogleTest
# suite through CTest. Then a third tree, build-tsan/, with ThreadSanitizer and only the graph
# tests (the suite where the graph's threads, the encoder pool and the committer's threads meet),
# run under 1, 2, 4 and 16 threads, against a libtbb built with TSan too (Note [ThreadSanitizer
# and oneTBB] below). Then the libFuzzer targets of tests/fuzz, side by side (one
# per core), each for a bounded time from seeds made here. Any sanitizer report, failed test or
# fuzzer finding fails the script. Needs the Debian packages that tools/setup.sh installs
# (clang-14, libclang-rt-14-dev, llvm-14).
#
# Environment: PRECOMPUTE_TSAN=0 skips the TSan tree; PRECOMPUTE_FUZZ_MANIFEST_S,
# PRECOMPUTE_FUZZ_MEDIA_S (seconds per fuzzer, default 30 and 60; 0 skips it). A finding is saved as build-asan/fuzz/NAME/crash-* (or leak-, timeout-);
# replay it with build-asan/tests/fuzz/NAME FILE. The corpora grow in build-asan/fuzz/NAME/corpus
# from run to run.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
build=build-asan

if [ ! -f "$build/build.ninja" ]; then
  # -O1: -O0 compiles in half the time but runs the fuzzers 3-4 times slower. Line tables are all
  # that stack traces need. The flags replace RelWithDebInfo's, whose NDEBUG would turn off assert.
  cmake -S . -B "$build" -G Ninja \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DPRECOMPUTE_SANITIZE="address;undefined" -DPRECOMPUTE_WITH_TORCH=OFF -DPRECOMPUTE_FUZZ=ON
fi
step=$SECONDS
cmake --build "$build"
echo "test_sanitized: configure and build took $((SECONDS - started)) s (build $((SECONDS - step)) s)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:print_stacktrace=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || true)}

step=$SECONDS
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
echo "test_sanitized: ctest took $((SECONDS - step)) s"

# Note [ThreadSanitizer and oneTBB]
# Debian's libtbb is not built with TSan, so TSan does not see its scheduler hand a task (and the
# message in it) from the thread that spawned it to the thread that runs it, nor its small-object
# pool reuse a task's memory: it reports hundreds of races in every graph run (687 in the graph
# tests, none of them real). Suppressions cannot tell those from ours, since every message of
# the graph passes through the scheduler. So the TSan tree links a libtbb built with TSan from
# the Debian source of the installed version (apt-get source, into a private apt state; the
# system's is untouched), built once into build-tsan/onetbb/ (about 30 s on 2 cores). With it
# the graph tests report nothing, without any suppression. PRECOMPUTE_ONETBB_SOURCE=DIR uses an
# unpacked oneTBB source tree instead (of the installed version) on a machine without apt.
tsan_onetbb() {
  local root=$1 src=${PRECOMPUTE_ONETBB_SOURCE:-}
  [ -f "$root/install/lib/cmake/TBB/TBBConfig.cmake" ] && return 0
  if [ -z "$src" ]; then
    local package version apt_dir=$PWD/$root/apt
    package=$(dpkg-query -W -f='${source:Package}' libtbb-dev)
    version=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
    rm -rf "$apt_dir" "$root/src"
    mkdir -p "$apt_dir/parts" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" \
      "$apt_dir/download"
    # deb-src entries for the machine's deb entries.
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] && sed 's/^Types: deb$/Types: deb-src/' "$f" > "$apt_dir/parts/$(basename "$f")"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] && sed -n 's/^deb /deb-src /p' "$f" > "$apt_dir/parts/$(basename "$f").list"
    done
    local apt=(apt-get -q -o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$apt_dir/parts"
               -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
               -o APT::Sandbox::User=root)
    # A source without deb-src indexes fails the update but not the download from the others.
    "${apt[@]}" update > "$apt_dir/update.log" 2>&1 || echo "test_sanitized: apt-get update: see $apt_dir/update.log"
    (cd "$apt_dir/download" && "${apt[@]}" source --download-only "$package=$version") \
      > "$apt_dir/source.log" 2>&1 || {
      cat "$apt_dir/source.log"
      echo "test_sanitized: cannot get the source of $package $version for the TSan build;" \
           "set PRECOMPUTE_ONETBB_SOURCE=DIR (a oneTBB $version tree) or PRECOMPUTE_TSAN=0" >&2
      return 1
    }
    dpkg-source -x "$apt_dir/download/"*.dsc "$root/src" > "$apt_dir/unpack.log" 2>&1
    src=$root/src
  fi
  cmake -S "$src" -B "$root/build" -G Ninja \
    -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
    -DTBB_SANITIZE=thread -DTBB_TEST=OFF -DTBBMALLOC_BUILD=OFF -DTBB_STRICT=OFF \
    -DCMAKE_INSTALL_PREFIX="$PWD/$root/install" > "$root/configure.log"
  cmake --build "$root/build"
  cmake --install "$root/build" > /dev/null
}

if [ "${PRECOMPUTE_TSAN:-1}" != 0 ]; then
  step=$SECONDS
  tsan=build-tsan
  tsan_onetbb "$tsan/onetbb"
  if [ ! -f "$tsan/build.ninja" ]; then
    cmake -S . -B "$tsan" -G Ninja \
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
      -DPRECOMPUTE_SANITIZE=thread -DPRECOMPUTE_WITH_TORCH=OFF \
      -DTBB_DIR="$PWD/$tsan/onetbb/install/lib/cmake/TBB"
  fi
  # Only the graph tests and what they link.
  cmake --build "$tsan" --target graph_test
  echo "test_sanitized: TSan build took $((SECONDS - step)) s"
  step=$SECONDS
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
    "$tsan/tests/unit/graph_test" --gtest_brief=1
  echo "test_sanitized: graph tests under TSan took $((SECONDS - step)) s"
fi

step=$SECONDS
fuzz="$build/fuzz"
rm -rf "$fuzz/seeds"
tests/fuzz/make_seeds.sh "$fuzz/seeds"

# Inputs that fuzzing once found (tests/fuzz/regressions/NAME/), replayed first and then seeds
# for the fuzzer as well. One small input decodes in well under 128 MiB (with ASan's overhead);
# the limit here is 256, where fuzzing allows 2048 for its whole corpus: a file of a few KiB
# that needs hundreds of megabytes is a finding (one made a seek loop allocate 2 GiB).
for dir in tests/fuzz/regressions/*/; do
  name=$(basename "$dir")_fuzzer
  "$build/tests/fuzz/$name" -rss_limit_mb=256 -timeout=10 "$dir"* > "$fuzz/$name.regressions.log" 2>&1 || {
    tail -n 40 "$fuzz/$name.regressions.log"
    echo "test_sanitized: $name failed on a regression input (log: $fuzz/$name.regressions.log)"
    exit 1
  }
  cp "$dir"* "$fuzz/seeds/$(basename "$dir")/"
done
echo "test_sanitized: regression inputs replayed"

# run_fuzzer NAME SECONDS SEED_DIR: starts NAME in the background, its output in NAME/log.
pids=()
names=()
run_fuzzer() {
  local name=$1 seconds=$2 seeds=$3
  [ "$seconds" -gt 0 ] || return 0
  mkdir -p "$fuzz/$name/corpus"
  # -timeout: one input that runs for 10 s is a hang; -rss_limit_mb: a runaway allocation.
  "$build/tests/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$fuzz/$name/" "$fuzz/$name/corpus" "$seeds" \
    > "$fuzz/$name/log" 2>&1 &
  pids+=($!)
  names+=("$name")
}
run_fuzzer manifest_fuzzer "${PRECOMPUTE_FUZZ_MANIFEST_S:-30}" "$fuzz/seeds/manifest"
run_fuzzer media_fuzzer "${PRECOMPUTE_FUZZ_MEDIA_S:-60}" "$fuzz/seeds/media"
run_fuzzer tar_fuzzer "${PRECOMPUTE_FUZZ_TAR_S:-30}" "$fuzz/seeds/tar"

failed=0
for i in "${!pids[@]}"; do
  name=${names[$i]}
  if wait "${pids[$i]}"; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$fuzz/$name/log")
    echo "test_sanitized: $name: ${runs:-?} inputs, corpus of $(ls "$fuzz/$name/corpus" | wc -l)"
  else
    failed=1
    echo "test_sanitized: $name FAILED; the end of $fuzz/$name/log:" >&2
    tail -n 80 "$fuzz/$name/log" >&2
  fi
done
echo "test_sanitized: fuzzing took $((SECONDS - step)) s; all took $((SECONDS - started)) s"
exit "$failed"
