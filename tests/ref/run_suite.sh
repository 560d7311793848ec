#!/usr/bin/env bash
# Generate a NumPy reference suite into a temporary folder and check kiln
# against it.  Usage: run_suite.sh KILN ops|examples [CHECK.PY OPTIONS...]
# (e.g. --kiln-arg=--device=host to check compiled code).
set -euo pipefail
kiln=$1 suite=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"${PYTHON:-python3}" "$here/${suite}_$( [ "$suite" = ops ] && echo cases || echo ref ).py" "$dir"
"${PYTHON:-python3}" "$here/check.py" "$kiln" "$dir" "$@"
