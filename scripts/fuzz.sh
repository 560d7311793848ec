#!/usr/bin/env bash
# Fuzz the two frontends for a bounded time each: the .kl parser from the
# examples and malformed-input tests, the ONNX loader from ONNX's own test
# models.  Usage: scripts/fuzz.sh [SECONDS_EACH]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

dsl=build-fuzz/corpus-dsl
mkdir -p "$dsl"
cp examples/*.kl tests/dsl_errors/*.kl "$dsl"/
onnx=build-fuzz/corpus-onnx
if [ ! -d "$onnx" ]; then
  mkdir -p "$onnx"
  data=/usr/share/libonnx-testdata/data
  for m in "$data"/*/*/model.onnx; do
    cp "$m" "$onnx/$(basename "$(dirname "$m")").onnx"
  done
fi
# Inputs that once crashed stay in the corpus, so a regression shows at once.
cp tests/fuzz/regressions/dsl/* "$dsl"/ 2>/dev/null || true
cp tests/fuzz/regressions/onnx/* "$onnx"/ 2>/dev/null || true
rc=0
for target in dsl onnx; do
  corpus=build-fuzz/corpus-$target
  echo "== fuzz_$target for ${secs}s from $(ls "$corpus" | wc -l) seeds"
  build-fuzz/tests/fuzz_$target -max_total_time="$secs" -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/$target- \
    "$corpus" 2>&1 | grep -vE "^#[0-9]+" || rc=1
done
exit $rc
