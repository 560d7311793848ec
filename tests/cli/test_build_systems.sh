#!/usr/bin/env bash
# Kiln from a build system (issue 17): `meson install` into a temporary
# prefix, the prefix moved elsewhere, and from there
#   - examples/make   (make, kiln's depfile, pkg-config of the model folder),
#   - examples/cmake  (find_package(Kiln), kiln_add_model),
#   - examples/meson  (kilnrt.pc through -Dpkg_config_path; two models in one
#                      program), with no environment variable set,
# each built from a clean folder by its own tool; the program's output
# against `kiln run --device=interp` on the same input; the model touched
# and the build run again, which must compile it again.
# Usage: test_build_systems.sh KILN
set -uo pipefail
kiln=$(realpath "$1")
build=$(dirname "$kiln")
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "PASS $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/  /' <<<"$2" | tail -15; }
if ! "$py" -c 'import numpy' 2>/dev/null; then
  bad "this test needs numpy in $py (scripts/setup.sh installs it)"; echo "$passed passed, $failed failed"; exit 1
fi
for tool in make cmake meson ninja pkg-config; do
  command -v "$tool" >/dev/null || { bad "this test needs $tool (scripts/setup.sh installs it)"; echo "$passed passed, $failed failed"; exit 1; }
done

# install, then move the prefix: nothing may point at the first place
if log=$(meson install -C "$build" --destdir "$tmp/stage" --no-rebuild --quiet 2>&1) &&
   prefix=$(meson introspect "$build" --buildoptions | "$py" -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"][0])') &&
   libdir=$(meson introspect "$build" --buildoptions | "$py" -c 'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "libdir"][0])') &&
   mv "$tmp/stage$prefix" "$tmp/moved"; then ok install_and_move
else bad install_and_move "$log"; echo "$passed passed, $failed failed"; exit 1; fi
inst=$tmp/moved
version=$(env -i PATH=/usr/bin:/bin "$inst/bin/kiln" --version 2>&1)
if grep -q "runtime headers: $inst/include/kiln" <<<"$version" && grep -q "runtime libraries: $inst/$libdir" <<<"$version"; then
  ok installed_kiln_finds_its_runtime
else bad installed_kiln_finds_its_runtime "$version"; fi
for f in bin/kiln include/kiln/kilnrt.h include/kiln/emu/kiln_prelude.h include/kiln/emu/kiln_emu.h \
         "$libdir/libkilnrt.a" "$libdir/libkilnrt.so" "$libdir/pkgconfig/kilnrt.pc" \
         "$libdir/cmake/Kiln/KilnConfig.cmake" share/man/man1/kiln.1 \
         share/doc/kiln/examples/meson/meson.build share/doc/kiln/examples/make/Makefile \
         share/doc/kiln/examples/cmake/CMakeLists.txt; do
  [ -e "$inst/$f" ] || missing="${missing:-} $f"
done
if [ -z "${missing:-}" ]; then ok installed_files; else bad installed_files "missing:$missing"; fi

# the models in a folder of their own (touched below), an input, the reference
mkdir -p "$tmp/model" && cp "$root/examples/mlp.kl" "$root/examples/cnn.kl" "$tmp/model/"
"$py" -c 'import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(5).random((32, 784), dtype=np.float32))' "$tmp/x.npy"
"$kiln" run "$tmp/model/mlp.kl" --device=interp --input x="$tmp/x.npy" --output-dir "$tmp/ref" >/dev/null 2>&1 ||
  bad reference "kiln run failed"
# same NAME OUT.npy: the program's output against the interpreter's
same() {
  if "$py" -c 'import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
sys.exit(0 if a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-6) else 1)' "$2" "$tmp/ref/output_0.npy"; then
    ok "$1"
  else bad "$1" "output differs from kiln run --device=interp"; fi
}
# rebuilt NAME LOG: the second build compiled the model again
rebuilt() { if grep -q "$2" <<<"$3"; then ok "$1"; else bad "$1" "$3"; fi; }

# make
mk=(make -C "$root/examples/make" KILN="$inst/bin/kiln" BUILD="$tmp/make" MODEL="$tmp/model/mlp.kl")
if log=$("${mk[@]}" 2>&1) && "$tmp/make/app" "$tmp/x.npy" "$tmp/make.npy" >/dev/null 2>&1; then
  ok make_builds_and_runs; same make_output "$tmp/make.npy"
else bad make_builds_and_runs "$log"; fi
sleep 1 && touch "$tmp/model/mlp.kl"
rebuilt make_rebuilds_after_touch "kiln\" compile\|kiln compile" "$("${mk[@]}" 2>&1)"

# cmake
if log=$(cmake -S "$root/examples/cmake" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$inst" \
           -DMODEL="$tmp/model/mlp.kl" 2>&1 && cmake --build "$tmp/cmake" 2>&1) &&
   "$tmp/cmake/app" "$tmp/x.npy" "$tmp/cmake.npy" >/dev/null 2>&1; then
  ok cmake_builds_and_runs; same cmake_output "$tmp/cmake.npy"
else bad cmake_builds_and_runs "$log"; fi
sleep 1 && touch "$tmp/model/mlp.kl"
rebuilt cmake_rebuilds_after_touch "kiln: compiling" "$(cmake --build "$tmp/cmake" 2>&1)"

# meson, with no environment variable but PATH; kiln is the one kilnrt.pc
# names (its `kiln` variable)
clean=(env -i PATH="$PATH")
if log=$("${clean[@]}" meson setup "$tmp/meson" "$root/examples/meson" \
           -Dpkg_config_path="$inst/$libdir/pkgconfig" -Dmodel_dir="$tmp/model" 2>&1 &&
         "${clean[@]}" ninja -C "$tmp/meson" 2>&1) &&
   out=$("${clean[@]}" "$tmp/meson/app" "$tmp/x.npy" "$tmp/meson.npy" 2>&1); then
  ok meson_builds_and_runs; same meson_output "$tmp/meson.npy"
  rebuilt meson_two_models_in_one_program "app: ran cnn" "$out"
else bad meson_builds_and_runs "${log:-}${out:-}"; fi
sleep 1 && touch "$tmp/model/mlp.kl"
rebuilt meson_rebuilds_after_touch "kiln: wrote" "$("${clean[@]}" ninja -C "$tmp/meson" 2>&1)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
