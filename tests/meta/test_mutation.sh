#!/usr/bin/env bash
# The suites' tolerances can fail: with one kernel made wrong by a small
# factor (kiln_test_break: KILN_TEST_BREAK_OP's result times
# KILN_TEST_BREAK_SCALE, the hook `kiln check`'s test uses), each suite
# that compares compiled code must fail on a slice of its cases.  The
# factor is sized to the suite's arithmetic: 1e-3 where f32 results are
# compared at 1e-5, 1% for ONNX's backend tests (compared at ONNX's 1e-3),
# 2% for the precision suite (fp16 is judged at 8 units of roundoff, 0.4%).
# Usage: test_mutation.sh KILN_TEST_BREAK CONFORMANCE ONNX_DATA EXPECTED
set -uo pipefail
brk=$(realpath "$1") runner=$(realpath "$2") data=$3 expected=$(realpath "$4")
tests=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

# must_fail NAME SCALE CMD...: CMD, with `add` broken by SCALE, exits
# non-zero and prints a failure
must_fail() {
  local name=$1 scale=$2
  shift 2
  KILN_TEST_BREAK_OP=add KILN_TEST_BREAK_SCALE=$scale "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && grep -qiE "^(FAIL|REGRESSION)" "$tmp/$name.out"; then
    passed=$((passed + 1)); echo "PASS $name: add x$scale fails it ($(grep -ciE '^(FAIL|REGRESSION)' "$tmp/$name.out") failures)"
  else
    failed=$((failed + 1)); echo "FAIL $name: add x$scale went unnoticed (exit $rc)"; tail -5 "$tmp/$name.out"
  fi
}

"$py" "$tests/ref/examples_ref.py" "$tmp/examples" >/dev/null
must_fail numpy_examples_host 1.001 "$py" "$tests/ref/check.py" "$brk" "$tmp/examples" --kiln-arg=--device=host
must_fail fusion_random_graphs 1.001 "$py" "$tests/fusion/random_graphs.py" "$brk" --count 6
must_fail onnx_models_host 1.001 "$py" "$tests/onnx_models/check_models.py" "$brk" --build -k resnet \
  --kiln-arg=--device=host
must_fail precision_models 1.02 "$py" "$tests/precision/check_precision.py" "$brk" --no-onnx -k transformer
must_fail onnx_conformance_host 1.01 "$runner" "$data" --filter test_add --device host --expected "$expected"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
