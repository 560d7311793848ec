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

int kl_nvrtc_compile(const char *src, const char *prelude, int sm, int flags, unsigned char **out,
                     size_t *out_len, char **log_out, kl_error *err) {
  bool ptx = flags & KL_NVRTC_PTX, report = !ptx && (flags & KL_NVRTC_RESOURCES);
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
  const char *opts[] = {arch, "--std=c++17", "-default-device", "--fmad=true", "--ptxas-options=-v"};
  r = lib.compile(prog, (int)(sizeof opts / sizeof *opts) - !report, opts);
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

/* ptxas -v, per kernel:
 *   ptxas info    : Compiling entry function 'k0' for 'sm_90'
 *   ptxas info    : Function properties for k0
 *       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 16 registers, used 0 barriers, 1024 bytes smem, 380 bytes cmem[0] */
int kl_nvrtc_resources(const char *log, kl_kernel_resources *out, int cap) {
  int n = -1;
  for (const char *next = log; next && *next;) {
    /* one line at a time: the searches below must not run into the next */
    char line[512];
    const char *end = strchr(next, '\n');
    size_t len = end ? (size_t)(end - next) : strlen(next);
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), next);
    next = end ? end + 1 : NULL;
    const char *at, *props;
    long stack, stores, loads;
    int regs;
    if ((at = strstr(line, "Compiling entry function '"))) {
      n++;
      if (n < cap) {
        memset(&out[n], 0, sizeof out[n]);
        sscanf(at + 26, "%63[^']", out[n].name);
      }
    } else if (n < 0 || n >= cap) {
      continue;
    } else if ((props = strstr(line, "bytes stack frame"))) {
      /* "ptxas . 0 bytes stack frame, ..." (NVRTC) or "    0 bytes ..." */
      const char *p = props;
      while (p > line && (p[-1] == ' ' || (p[-1] >= '0' && p[-1] <= '9'))) p--;
      if (sscanf(p, " %ld bytes stack frame, %ld bytes spill stores, %ld bytes spill loads", &stack, &stores,
                 &loads) == 3)
        out[n].stack_bytes = stack, out[n].spill_bytes = stores + loads;
    } else if ((at = strstr(line, "Used ")) && sscanf(at, "Used %d registers", &regs) == 1) {
      out[n].registers = regs;
      const char *smem = strstr(at, " bytes smem");
      if (smem) {
        const char *p = smem;
        while (p > at && p[-1] >= '0' && p[-1] <= '9') p--;
        out[n].shared_bytes = strtol(p, NULL, 10);
      }
    }
  }
  return n + 1;
}

int kl_ptx_f64_instructions(const char *ptx) {
  int count = 0;
  for (const char *line = ptx; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '@') { /* a predicate: @%p1 or @!%p1 */
      while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
      while (*p == ' ' || *p == '\t') p++;
    }
    if (*p < 'a' || *p > 'z') continue; /* directives (.reg .f64), labels, braces */
    const char *end = p;
    while (*end && *end != ' ' && *end != '\t' && *end != '\n' && *end != ';') end++;
    for (const char *q = p; q + 4 <= end; q++)
      if (!strncmp(q, ".f64", 4) && (q + 4 == end || q[4] == '.')) {
        count++;
        break;
      }
  }
  return count;
}
