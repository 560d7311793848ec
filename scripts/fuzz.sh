#!/usr/bin/env bash
# Fuzz the .kl parser for a bounded time from the seed corpus (examples and
# the malformed-input tests).  Usage: scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
corpus=build-fuzz/corpus-dsl
mkdir -p "$corpus"
cp examples/*.kl tests/dsl_errors/*.kl "$corpus"/ 2>/dev/null || true
export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
build-fuzz/tests/fuzz_dsl -max_total_time="$secs" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/ "$corpus"
