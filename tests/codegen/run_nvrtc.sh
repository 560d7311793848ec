#!/usr/bin/env bash
# Generate the NumPy reference cases, then check NVRTC on every model.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"${PYTHON:-python3}" "$here/../ref/ops_cases.py" "$dir" >/dev/null
"${PYTHON:-python3}" "$here/check_nvrtc.py" "$1" "$dir"
