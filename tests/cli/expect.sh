# expect.sh - the check the shell test scripts share; source it after
# setting passed=0 failed=0.
# expect NAME CODE PATTERN -- CMD...: exit code CODE and PATTERN in stdout+stderr
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  # a sanitizer report fails the check whatever the exit code
  if [ "$rc" -eq "$code" ] && grep -qE -- "$pattern" <<<"$out" &&
     ! grep -qE "Sanitizer|runtime error:" <<<"$out"; then
    passed=$((passed + 1)); echo "PASS $name"
  else
    failed=$((failed + 1)); echo "FAIL $name: exit $rc (want $code), output:"; sed 's/^/  /' <<<"$out" | head -12
  fi
}
