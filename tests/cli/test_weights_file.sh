#!/usr/bin/env bash
# kiln compile --weights-file (issue 17): a program or library whose weights
# lie in a file beside it, mapped when the model is created.  The program's
# outputs against the embedded build's, byte for byte; the file found
# beside a moved program, through KILN_WEIGHTS_DIR and where it was written;
# a missing, truncated or altered file refused, naming what was expected;
# auto: embedded below 64 MiB, beside the program above.
# Usage: test_weights_file.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
passed=0 failed=0
. "$here/expect.sh"

# same NAME A.npy B.npy: byte-equal outputs
same() {
  if cmp -s "$2" "$3"; then passed=$((passed + 1)); echo "PASS $1"
  else failed=$((failed + 1)); echo "FAIL $1: $2 and $3 differ"; fi
}
# smaller NAME FILE BYTES: FILE is under BYTES bytes
smaller() {
  local size; size=$(stat -c %s "$2" 2>/dev/null || echo 999999999999)
  if [ "$size" -lt "$3" ]; then passed=$((passed + 1)); echo "PASS $1 ($size bytes)"
  else failed=$((failed + 1)); echo "FAIL $1: $2 is $size bytes, not under $3"; fi
}

cnn=$root/examples/cnn.kl
expect embedded_build 0 "wrote cnn_embedded" -- "$kiln" compile "$cnn" --emit=exe -o cnn_embedded --weights-file=embed --no-nvrtc
expect embed_writes_no_file 1 "" -- test -e cnn_embedded.weights
expect file_build 0 "are in cnn.w, which the program maps" -- "$kiln" compile "$cnn" --emit=exe -o cnn --weights-file=cnn.w --no-nvrtc
expect file_written 0 "" -- test -s cnn.w
expect embedded_runs 0 "device: host" -- ./cnn_embedded --device=host --seed 3 --output-dir out_embedded
expect file_runs 0 "device: host" -- ./cnn --device=host --seed 3 --output-dir out_file
same file_matches_embedded out_embedded/output_0.npy out_file/output_0.npy
# the size the program saves: the weights' 80512 bytes gone from it, give
# or take the linker's page alignment of the sections around them
smaller program_without_weights cnn $(( $(stat -c %s cnn_embedded) - 80512 + 8192 ))

# found beside a moved program, and through KILN_WEIGHTS_DIR
mkdir moved elsewhere
mv cnn moved/ && mv cnn.w moved/
expect found_beside_program 0 "device: host" -- moved/cnn --device=host --seed 3 --output-dir out_moved
same moved_matches out_embedded/output_0.npy out_moved/output_0.npy
mv moved/cnn.w elsewhere/
expect missing_names_folders 1 "weights file cnn.w was not found \(looked in $tmp/moved, $tmp" -- moved/cnn --device=host
expect found_through_env 0 "device: host" -- env KILN_WEIGHTS_DIR="$tmp/elsewhere" moved/cnn --device=host
# refused: a truncated file, an altered byte
head -c 1000 elsewhere/cnn.w > moved/cnn.w
expect truncated_refused 1 "is 1000 bytes; the model was compiled with 80512" -- moved/cnn --device=host
cp elsewhere/cnn.w moved/cnn.w
printf '\x7f' | dd of=moved/cnn.w bs=1 seek=4000 conv=notrunc 2>/dev/null
expect altered_refused 1 "has CRC-32 [0-9a-f]{8}; the model was compiled with [0-9a-f]{8}" -- moved/cnn --device=host

# a library: the file beside libkiln_cnn.a; a program linked to it runs
expect lib_build 0 "are in lib/cnn_weights.bin" -- "$kiln" compile "$cnn" --emit=lib -o lib --weights-file=lib/cnn_weights.bin --no-nvrtc
expect lib_file_written 0 "" -- test -s lib/cnn_weights.bin
cat > app.c <<'C'
#include <stdio.h>
#include "cnn.h"
int main(void) {
  const krt_model_api *api = kiln_model_cnn();
  krt_device *d = NULL;
  void *m = NULL;
  char err[512];
  if (krt_device_open(KRT_DEVICE_HOST, &d, err, sizeof err) || api->create(d, &m, err, sizeof err)) {
    fprintf(stderr, "app: %s\n", err);
    return 1;
  }
  printf("created, weights %zu bytes\n", api->param_bytes);
  api->destroy(m);
  krt_device_close(d);
  return 0;
}
C
expect lib_links 0 "" -- sh -c "cc -o app app.c \$(PKG_CONFIG_PATH=lib pkg-config --cflags --libs --static kiln_cnn)"
expect lib_program_maps 0 "created, weights 80512 bytes" -- ./app

# auto: a small model stays embedded; 68 MB of weights go beside the program
expect auto_small_embeds 0 "wrote small" -- "$kiln" compile "$cnn" --emit=exe -o small --no-nvrtc
expect auto_small_no_file 1 "" -- test -e small.weights
cat > big.kl <<'KL'
input x: f32[2, 4096]
param w: f32[4096, 4160] = randn(0.01, seed=3)
output y = x @ w
KL
expect auto_big_beside 0 "are in big.weights" -- "$kiln" compile big.kl --emit=exe -o big --no-nvrtc
smaller auto_big_program_small big 20000000
expect auto_big_runs 0 "device: host" -- ./big --device=host --seed 1 --output-dir out_big
expect big_reference 0 "device: host" -- "$kiln" run big.kl --device=host --seed 1 --output-dir out_big_ref
same auto_big_matches_kiln_run out_big/output_0.npy out_big_ref/output_0.npy

# only for artifacts
expect not_for_cu 2 "is for --emit=exe and --emit=lib" -- "$kiln" compile "$cnn" --emit=cu -o cu --weights-file=x.w
expect empty_refused 2 "takes auto, embed or a FILE" -- "$kiln" compile "$cnn" --emit=exe -o e --weights-file=

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
