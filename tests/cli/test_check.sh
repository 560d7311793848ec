#!/usr/bin/env bash
# kiln check: a correct build agrees with the interpreter (exit 0) in fp32
# and fp16, fused and unfused; a build with one op broken on purpose
# (kiln_test_break, KILN_TEST_BREAK_OP) is caught (exit 1) and the bisection
# names exactly the node that diverges.  Usage: test_check.sh KILN KILN_TEST_BREAK
set -uo pipefail
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
  echo "FAIL: $py has no onnx (scripts/setup.sh installs it)"
  exit 1
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

# run_all NAME CODE CMD... then PATTERNS: one run, its exit code and every
# pattern (lines of grep -E) in its output; `!PATTERN` must not be there.
run_all() {
  local name=$1 code=$2 out rc p bad=""
  shift 2
  local cmd=() pats=()
  while [ "$1" != "--" ]; do cmd+=("$1"); shift; done
  shift
  pats=("$@")
  out=$("${cmd[@]}" 2>&1)
  rc=$?
  [ "$rc" -eq "$code" ] || bad="exit $rc (want $code)"
  for p in "${pats[@]}"; do
    if [ "${p:0:1}" = "!" ]; then grep -qE -- "${p:1}" <<<"$out" && bad="$bad; has '${p:1}'"
    else grep -qE -- "$p" <<<"$out" || bad="$bad; no '$p'"; fi
  done
  if [ -z "$bad" ]; then passed=$((passed + 1)); echo "PASS $name"
  else failed=$((failed + 1)); echo "FAIL $name: $bad, output:"; sed 's/^/  /' <<<"$out" | head -20; fi
}

ok="all outputs within tolerance"
named="^first divergent node: 'model_block2_Relu' \(ONNX Relu 'model/block2/Relu'\), output 'h10'"
for prec in fp32 fp16; do
  for fuse in "" --no-fuse; do
    tag=${prec}${fuse:+_unfused}
    expect "correct_$tag" 0 "$ok" -- "$kiln" check m.onnx --device=host --precision=$prec $fuse
    # never the first Relu, whose values the break leaves right
    run_all "broken_$tag" 1 env KILN_TEST_BREAK_OP=relu "$broken" check m.onnx --device=host \
      --precision=$prec $fuse -- "^output 0 'y' f32\[4, 8\]: BEYOND tolerance" "$named" \
      "^  its inputs agree:" "^    'h9': max abs err" "!model/gate/Relu"
  done
done
# only the test build reads the variable; without it, the test build is kiln
expect kiln_ignores_break 0 "$ok" -- env KILN_TEST_BREAK_OP=relu "$kiln" check m.onnx --device=host
expect test_build_unbroken 0 "$ok" -- "$broken" check m.onnx --device=host

# .kl: more than one bisection round; the node is named with its place
expect kl_correct 0 "$ok" -- "$kiln" check chain.kl --device=host
run_all kl_broken 1 env KILN_TEST_BREAK_OP=relu "$broken" check chain.kl --device=host -- \
  "^bisect round 2:" "^first divergent node: 'h40' \(relu at chain.kl:$line40:[0-9]+\)" \
  "^  its inputs agree:"

# A whole training step (forward, backward, the update written over the
# params in place): every output, the new params and the optimizer state
# too, agrees with the interpreter.
root=$(cd "$(dirname "$0")/../.." && pwd)
expect training_step_agrees 0 "all outputs within tolerance" -- \
  "$kiln" check "$root/examples/train_mlp.kl" --train --device host

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
