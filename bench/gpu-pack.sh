#!/usr/bin/env bash
# Pack what bench/gpu-check.sh needs for a GPU machine that can fetch
# nothing (the device machine lent to sessions: no apt, no pip, no flex,
# bison, protobuf-c or OpenBLAS): kiln and the two test programs built
# here, the shared libraries they load that are not part of glibc or CUDA,
# and ONNX's test data.  Writes .gpu/kiln-gpu.tar.gz (git ignores .gpu/);
# carry .gpu with the working tree and run bench/gpu-check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
# --sources-sum: one checksum of the sources the pack's programs are built
# from (gpu-check.sh compares it, on a tree that may have no .git)
sources_sum() {
  find driver codegen passes ir frontend runtime tests/conformance meson.build -type f \
    ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}
if [ "${1:-}" = --sources-sum ]; then sources_sum; exit 0; fi
scripts/setup.sh >/dev/null
data=/usr/share/libonnx-testdata/data
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .gpu
cp build/kiln build/tests/test_device build/tests/conformance "$stage/bin/"
# every library they need except glibc's own and the compiler runtime,
# which any x86-64 Linux with a C compiler has (glibc here is 2.36: the
# binaries run on any newer one)
for b in "$stage"/bin/*; do
  ldd "$b" | awk '/=> \// { print $3 }'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
cp -r "$data" "$stage/onnx-testdata"
# what it was built from: gpu-check.sh refuses a pack of other sources
sources_sum >"$stage/sources.sum"
{ git rev-parse --short HEAD; git diff --quiet HEAD || echo "(with uncommitted changes)"; } |
  paste -sd' ' >"$stage/commit"
tar czf .gpu/kiln-gpu.tar.gz -C "$stage" commit sources.sum bin lib onnx-testdata
echo "gpu-pack: .gpu/kiln-gpu.tar.gz, $(du -h .gpu/kiln-gpu.tar.gz | cut -f1)" \
  "($(ls "$stage/lib" | tr '\n' ' '))"
