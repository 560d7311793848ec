#!/bin/sh
# run_emu_tests.sh - build and run the host-device emulator tests outside
# meson, in every configuration that matters:
#   1. emu_kernels.cu through NVRTC for sm_90 (no GPU needed; skipped, with
#      a note, when libnvrtc is missing), with the prelude's own fp16 types
#      and with cuda_fp16.h;
#   2. the host build with the x86-64 switch, and with ucontext;
#   3. ASan + UBSan, and TSan, with gcc and with clang;
#   4. the benchmarks (--bench).
# usage: tests/emu/run_emu_tests.sh [BUILD_DIR]   (from anywhere)
#        tests/emu/run_emu_tests.sh --ci BUILD_DIR
# --ci (the meson test emu_variants): only what the meson suites do not
# build themselves, the ucontext switch and ThreadSanitizer (gcc), ending
# with "N passed, N failed" over the two programs.
# CUDA_HOME (default /usr/local/cuda) locates NVRTC.
set -eu  # (no pipelines here: plain sh)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ci=0
if [ "${1:-}" = --ci ]; then ci=1; shift; fi
out=${1:-${TMPDIR:-/tmp}/kiln-emu-tests}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out"
warn="-std=c11 -Wall -Wextra -Wshadow -Werror -D_POSIX_C_SOURCE=200809L"
inc="-I$root/runtime/emu"

# build NAME COMPILER FLAGS...: the test program in $out/NAME
build() {
  name=$1 c=$2
  shift 2
  mkdir -p "$out/$name.o"
  for src in "$root/runtime/emu/emu.c" "$here/emu_kernels_host.c" "$here/test_emu.c"; do
    $c $warn $inc "$@" -c "$src" -o "$out/$name.o/$(basename "$src" .c).o"
  done
  $c "$@" "$out/$name.o"/*.o -lcmocka -lm -lpthread -o "$out/$name"
}

if [ $ci = 1 ]; then
  passed=0 failed=0
  run() { # NAME FLAGS...: build and run one variant, counting it
    local name=$1
    shift
    echo "== $name"
    if build "$name" gcc "$@" && "$out/$name"; then passed=$((passed + 1))
    else failed=$((failed + 1)); echo "FAIL $name"; fi
  }
  set +e
  run emu-ucontext -O2 -g -DKL_EMU_UCONTEXT
  run emu-tsan -O1 -g -fsanitize=thread
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit
fi

echo "== NVRTC (sm_90)"
if [ -f "$cuda/include/nvrtc.h" ] && [ -e "$cuda/lib64/libnvrtc.so" ]; then
  cc $warn -I"$cuda/include" "$here/nvrtc_check.c" -L"$cuda/lib64" -lnvrtc \
     -Wl,-rpath,"$cuda/lib64" -o "$out/nvrtc_check"
  "$out/nvrtc_check" "$here/emu_kernels.cu" "$inc"
  "$out/nvrtc_check" "$here/emu_kernels.cu" "$inc" -DKL_CUDA_FP16_HEADERS -I"$cuda/include"
else
  echo "FAIL: no NVRTC under $cuda: this check needs the CUDA toolkit's NVRTC"
  exit 1
fi

echo "== host, x86-64 switch where available"
build emu cc -O2 -g
"$out/emu"
echo "== host, ucontext"
build emu-uc cc -O2 -g -DKL_EMU_UCONTEXT
"$out/emu-uc"

san="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
for c in gcc clang; do
  if command -v $c >/dev/null; then
    echo "== $c, ASan + UBSan"
    build emu-san-$c $c $san
    ASAN_OPTIONS=detect_stack_use_after_return=1:detect_leaks=1 "$out/emu-san-$c"
    echo "== $c, TSan"
    build emu-tsan-$c $c -O1 -g -fsanitize=thread
    "$out/emu-tsan-$c"
  fi
done

echo "== benchmarks"
"$out/emu" --bench
"$out/emu-uc" --bench
