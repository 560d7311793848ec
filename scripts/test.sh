#!/usr/bin/env bash
# Set up, then run every test: the normal build, the whole suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer, and a bounded fuzzing run.
# Ends with one line "N passed, N failed, N skipped" (scripts/count_tests.py:
# every listed test ran, each suite at least its floor of cases in
# tests/case_floors.txt, every skip for a reason in tests/skip_reasons.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
export PATH="$PWD/.venv/bin:$PATH" # the test tooling's python (see setup.sh)

jobs=$(nproc)
fuzz_seconds=${KILN_FUZZ_SECONDS:-45} # per target

[ -f build-asan/build.ninja ] ||
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false \
    -Dbuildtype=debug >/dev/null
[ -f build-fuzz/build.ninja ] ||
  CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false -Dbuildtype=debugoptimized >/dev/null
ninja -C build-asan >/dev/null || exit 1
ninja -C build-fuzz tests/fuzz_dsl tests/fuzz_onnx >/dev/null || exit 1

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0

# What each run must give a result for (count_tests.py checks it: a run
# that dies part-way leaves tests without one).
for b in build build-asan; do
  rm -f "$b/meson-logs/testlog.json"
  meson test -C "$b" --list >"$b/tests.list" 2>/dev/null || { echo "meson test --list failed in $b"; exit 1; }
done

# The two suites and the fuzzer run side by side.
meson test -C build --num-processes "$jobs" --print-errorlogs >build/test.out 2>&1 &
p1=$!
meson test -C build-asan --num-processes "$jobs" --print-errorlogs >build-asan/test.out 2>&1 &
p2=$!
scripts/fuzz.sh "$fuzz_seconds" >build-fuzz/fuzz.out 2>&1
fuzz_rc=$?
wait $p1; rc1=$?
wait $p2; rc2=$?

tail -n 25 build/test.out
echo "--- under ASan + UBSan"
tail -n 12 build-asan/test.out
echo "--- fuzzing (${fuzz_seconds}s)"
tail -n 5 build-fuzz/fuzz.out
python3 scripts/count_tests.py build build-asan --meson-rc build="$rc1" build-asan="$rc2" \
  --extra fuzzing="$fuzz_rc"
