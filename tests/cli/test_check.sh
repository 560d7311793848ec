#!/usr/bin/env bash
# kiln check: a correct build agrees with the interpreter (exit 0) in fp32
# and fp16, fused and unfused; a build with one op broken on purpose
# (kiln_test_break, KILN_TEST_BREAK_OP) is caught (exit 1) and the bisection
# names exactly the node that diverges.  Usage: test_check.sh KILN KILN_TEST_BREAK
set -u
kiln=$(realpath "$1")
broken=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0

. "$here/expect.sh"

# An ONNX chain with two Relus: the first reads a Sigmoid (positive values,
# which the broken relu gets right), the second, deep in the chain, values
# of both signs (check_model.py).
if ! "$py" -c "import onnx" 2>/dev/null; then
  echo "SKIP: $py has no onnx"
  exit 77
fi
"$py" "$here/check_model.py" m.onnx || exit 1
# A .kl chain of 60 steps, longer than one bisection round takes, with a
# relu of both signs at step 40.
{
  echo "input x: f32[4, 16]"
  prev=x
  for i in $(seq 1 60); do
    if [ "$i" -eq 40 ]; then echo "let h$i = relu($prev - 0.2)"
    else echo "let h$i = tanh($prev * 1.3 + 0.1)"; fi
    prev=h$i
  done
  echo "output y = $prev"
} > chain.kl
line40=$(grep -n "^let h40 " chain.kl | cut -d: -f1)

expect help 0 "usage: kiln check" -- "$kiln" check --help
expect no_model 2 "expected one MODEL" -- "$kiln" check
expect bad_device 2 "choose host, cuda or auto" -- "$kiln" check m.onnx --device=interp
expect missing_model 2 "cannot open 'nope.onnx'" -- "$kiln" check nope.onnx --device=host
expect says_seed 0 "seed 3" -- "$kiln" check m.onnx --device=host --seed 3

ok="all outputs within tolerance"
named="first divergent node: 'model_block2_Relu' \(ONNX Relu 'model/block2/Relu'\)"
for prec in fp32 fp16; do
  for fuse in "" --no-fuse; do
    tag=${prec}${fuse:+_unfused}
    expect "correct_$tag" 0 "$ok" -- "$kiln" check m.onnx --device=host --precision=$prec $fuse
    expect "broken_$tag" 1 "$named" -- env KILN_TEST_BREAK_OP=relu "$broken" check m.onnx \
      --device=host --precision=$prec $fuse
  done
done
expect broken_inputs_agree 1 "^  its inputs agree:" -- env KILN_TEST_BREAK_OP=relu "$broken" check \
  m.onnx --device=host
# only the test build reads the variable; without it, the test build is kiln
expect kiln_ignores_break 0 "$ok" -- env KILN_TEST_BREAK_OP=relu "$kiln" check m.onnx --device=host
expect test_build_unbroken 0 "$ok" -- "$broken" check m.onnx --device=host
# never the first Relu, whose values the break leaves right
out=$(KILN_TEST_BREAK_OP=relu "$broken" check m.onnx --device=host 2>&1)
if grep -q "model/gate/Relu" <<<"$out"; then
  failed=$((failed + 1)); echo "FAIL broken_not_gate: named the gate Relu"
else
  passed=$((passed + 1)); echo "PASS broken_not_gate"
fi

# .kl: more than one bisection round; the node is named with its place
expect kl_correct 0 "$ok" -- "$kiln" check chain.kl --device=host
expect kl_broken 1 "first divergent node: 'h40' \(relu at chain.kl:$line40:[0-9]+\)" \
  -- env KILN_TEST_BREAK_OP=relu "$broken" check chain.kl --device=host
expect kl_two_rounds 1 "^bisect round 2:" -- env KILN_TEST_BREAK_OP=relu "$broken" check chain.kl \
  --device=host

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
