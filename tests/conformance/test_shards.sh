#!/usr/bin/env bash
# --shard K/N: N shards of a slice of the suite run every test once, and
# their counts add up to the whole slice's (the GPU check runs shards side
# by side).  Usage: test_shards.sh CONFORMANCE DATA_DIR EXPECTED
set -uo pipefail
runner=$1 data=$2 expected=$3
counts() { grep -E '^conformance: [0-9]+ passed' | tr -cs '0-9' ' '; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# each run's exit status is kept: a runner that fails must fail this test
"$runner" "$data" --filter test_reduce --expected "$expected" > "$tmp/whole"; rcs="$?"
for k in 0 1 2; do
  "$runner" "$data" --filter test_reduce --shard "$k/3" --expected "$expected" > "$tmp/shard$k"
  rcs="$rcs $?"
done
whole=$(counts < "$tmp/whole")
sum=$(for k in 0 1 2; do counts < "$tmp/shard$k"; echo; done | awk '{ for (i = 1; i <= NF; i++) s[i] += $i } END { for (i = 1; i <= 6; i++) printf " %d", s[i]; print " " }')
passed=0 failed=0
check() { if [ "$2" = "$3" ]; then passed=$((passed + 1)); echo "PASS $1"; else
  failed=$((failed + 1)); echo "FAIL $1: '$2' against '$3'"; fi; }
check "the whole slice and its shards exit 0" "$rcs" "0 0 0 0"
check "three shards add up to the whole" "$(echo $sum)" "$(echo $whole)"
check "a slice of tests ran" "$([ "$(echo $whole | cut -d' ' -f1)" -gt 10 ] && echo yes)" yes
bad=$("$runner" "$data" --shard 3/3 2>&1); rc=$?
check "a shard out of range is refused" "$rc $(grep -c 'wants K/N' <<<"$bad")" "2 1"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
