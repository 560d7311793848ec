#!/usr/bin/env bash
# Under AddressSanitizer: a conformance test process that leaks fails its
# test (the runner's children end with _exit, which skips LeakSanitizer's
# own check, so runner.c runs it).  KILN_TEST_INJECT_LEAK makes each child
# drop a block; the same test without it passes.  The sanitizer's report
# goes to a file, not to this test's output (count_tests.py counts any
# report in a test's output as a failure).
# Usage: test_leak_check.sh CONFORMANCE DATA_DIR EXPECTED
set -uo pipefail
runner=$1 data=$2 expected=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
passed=0 failed=0
check() { if [ "$2" = "$3" ]; then passed=$((passed + 1)); echo "PASS $1"; else
  failed=$((failed + 1)); echo "FAIL $1: '$2', want '$3'"; tail -5 "$out"; fi; }

"$runner" "$data" --filter test_relu --expected "$expected" >"$out" 2>&1
check "a clean child passes" "$? $(grep -c '^conformance: 1 passed, 0 failed' "$out")" "0 1"
KILN_TEST_INJECT_LEAK=1 "$runner" "$data" --filter test_relu --expected "$expected" >"$out" 2>&1
rc=$?
check "a leaking child fails its test" "$rc $(grep -c "^fail .*test_relu: leaked memory" "$out")" "1 1"
check "with LeakSanitizer's report" "$(grep -c 'ERROR: LeakSanitizer: detected memory leaks' "$out")" "1"
# a check that dies after the result (LeakSanitizer's tracer has crashed
# that way on a loaded machine): run once more, then the results stand and
# the leak check counts as skipped, with its reason
KILN_TEST_LEAK_CHECK_DIES=1 "$runner" "$data" --filter test_relu --expected "$expected" >"$out" 2>&1
rc=$?
check "a crashed leak check runs again, then counts as skipped" \
  "$rc $(grep -c 'running the test again' "$out") $(grep -c "^SKIP leak check of node/test_relu: LeakSanitizer's tracer crashed twice" "$out") $(grep -c '^1 passed, 0 failed, 1 skipped$' "$out")" "0 1 1 1"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
