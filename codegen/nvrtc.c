/* nvrtc.c - compile kernels.cu in-process with NVRTC, loaded at run time
 * (dlopen), so kiln itself starts on machines without the CUDA toolkit and
 * only `--emit` of GPU images needs it.  The prelude travels as a named
 * header, so NVRTC needs no include path. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h> /* types only; the functions come from dlsym */

#include "codegen.h"

static struct {
  bool tried, ok;
  char why[256];
  __typeof__(nvrtcCreateProgram) *create;
  __typeof__(nvrtcCompileProgram) *compile;
  __typeof__(nvrtcGetProgramLogSize) *log_size;
  __typeof__(nvrtcGetProgramLog) *log;
  __typeof__(nvrtcGetCUBINSize) *cubin_size;
  __typeof__(nvrtcGetCUBIN) *cubin;
  __typeof__(nvrtcGetPTXSize) *ptx_size;
  __typeof__(nvrtcGetPTX) *ptx;
  __typeof__(nvrtcDestroyProgram) *destroy;
  __typeof__(nvrtcGetErrorString) *error_string;
} lib;

bool kl_cg_test_hide_nvrtc;

static bool load(void) {
  if (lib.tried) return lib.ok;
  lib.tried = true;
  if (kl_cg_test_hide_nvrtc) {
    snprintf(lib.why, sizeof lib.why, "NVRTC not found (libnvrtc.so): hidden by KILN_TEST_HIDE_NVRTC");
    return false;
  }
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                      "/usr/local/cuda/lib64/libnvrtc.so"};
  void *h = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++) h = dlopen(names[i], RTLD_NOW);
  if (!h) {
    snprintf(lib.why, sizeof lib.why, "NVRTC not found (libnvrtc.so): %s", dlerror());
    return false;
  }
#define SYM(field, name)                                                       \
  if (!(*(void **)&lib.field = dlsym(h, name))) {                              \
    snprintf(lib.why, sizeof lib.why, "libnvrtc has no %s", name);            \
    return false;                                                              \
  }
  SYM(create, "nvrtcCreateProgram")
  SYM(compile, "nvrtcCompileProgram")
  SYM(log_size, "nvrtcGetProgramLogSize")
  SYM(log, "nvrtcGetProgramLog")
  SYM(cubin_size, "nvrtcGetCUBINSize")
  SYM(cubin, "nvrtcGetCUBIN")
  SYM(ptx_size, "nvrtcGetPTXSize")
  SYM(ptx, "nvrtcGetPTX")
  SYM(destroy, "nvrtcDestroyProgram")
  SYM(error_string, "nvrtcGetErrorString")
#undef SYM
  lib.ok = true;
  return true;
}

bool kl_nvrtc_available(char *why, size_t len) {
  bool ok = load();
  if (!ok && why) snprintf(why, len, "%s", lib.why);
  return ok;
}

int kl_nvrtc_compile(const char *src, const char *prelude, int sm, bool ptx, unsigned char **out,
                     size_t *out_len, char **log_out, kl_error *err) {
  *out = NULL;
  *out_len = 0;
  if (log_out) *log_out = NULL;
  if (!load()) return kl_fail(err, (kl_loc){0}, "%s", lib.why);
  nvrtcProgram prog;
  const char *headers[1] = {prelude}, *names[1] = {"kiln_prelude.h"};
  nvrtcResult r = lib.create(&prog, src, "kernels.cu", 1, headers, names);
  if (r != NVRTC_SUCCESS)
    return kl_fail(err, (kl_loc){0}, "nvrtcCreateProgram: %s", lib.error_string(r));
  char arch[48];
  /* sm_XX gives a cubin for that GPU; compute_XX gives PTX any newer GPU
   * can JIT. */
  snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d", ptx ? "compute" : "sm", sm);
  /* FMA contraction on (NVRTC's default, said anyway): a fused multiply-add
   * rounds once where a multiply then an add round twice, so it is as
   * accurate or more; results differ from the host device's (no FMA) in
   * the last bits, which the GPU check's f32 tolerances allow. */
  const char *opts[] = {arch, "--std=c++17", "-default-device", "--fmad=true"};
  r = lib.compile(prog, (int)(sizeof opts / sizeof *opts), opts);
  size_t n = 0;
  char *log = NULL;
  if (lib.log_size(prog, &n) == NVRTC_SUCCESS && n > 1 && (log = malloc(n)))
    lib.log(prog, log);
  int rc = 0;
  if (r != NVRTC_SUCCESS) {
    rc = kl_fail(err, (kl_loc){0}, "NVRTC (%s) failed: %s\n%.700s", arch, lib.error_string(r),
                 log ? log : "");
  } else {
    r = ptx ? lib.ptx_size(prog, &n) : lib.cubin_size(prog, &n);
    unsigned char *buf = r == NVRTC_SUCCESS ? malloc(n + 1) : NULL;
    if (!buf || (ptx ? lib.ptx(prog, (char *)buf) : lib.cubin(prog, (char *)buf)) != NVRTC_SUCCESS) {
      free(buf);
      rc = kl_fail(err, (kl_loc){0}, "NVRTC: reading the %s failed", ptx ? "PTX" : "cubin");
    } else {
      buf[n] = 0;
      *out = buf;
      *out_len = n;
    }
  }
  if (log_out) *log_out = log;
  else free(log);
  lib.destroy(&prog);
  return rc;
}
