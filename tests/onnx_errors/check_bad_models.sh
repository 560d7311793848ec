#!/usr/bin/env bash
# Each malformed model must give exit 1 and its expected message (and no
# sanitizer report); a model with an empty expect.txt must run.
# Usage: check_bad_models.sh KILN
set -uo pipefail
kiln=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" "$here/make_bad_models.py" "$tmp" >/dev/null || { echo "0 passed, 1 failed"; exit 1; }
passed=0 failed=0
for d in "$tmp"/*/; do
  name=$(basename "$d")
  expect=$(cat "$d/expect.txt")
  out=$("$kiln" run "$d/model.onnx" --device=interp 2>&1)
  rc=$?
  if grep -qE "Sanitizer|runtime error:" <<<"$out"; then ok=0
  elif [ -z "$expect" ]; then [ $rc -eq 0 ] && ok=1 || ok=0
  else [ $rc -eq 1 ] && grep -qF -- "$expect" <<<"$out" && ok=1 || ok=0
  fi
  if [ $ok = 1 ]; then passed=$((passed + 1)); echo "PASS $name"
  else failed=$((failed + 1)); echo "FAIL $name (exit $rc, want '${expect:-success}'):"; sed 's/^/  /' <<<"$out" | head -5
  fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
