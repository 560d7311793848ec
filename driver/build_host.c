/* build_host.c - turn generated sources into a loaded model for the host
 * device: write them to a folder, compile kernels.cu and model.c with the
 * host C compiler against runtime/emu (so the CUDA C kernels run on the
 * CPU), and load the shared object.  The runtime functions it calls are
 * those of this kiln executable (it exports them). */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "driver.h"

static int write_file(const char *dir, const char *name, const char *text) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  fputs(text, f);
  if (fclose(f)) {
    fprintf(stderr, "kiln: error: writing %s failed\n", path);
    return -1;
  }
  return 0;
}

int kiln_write_sources(const kl_codegen_result *cg, const char *dir) {
  return write_file(dir, "kernels.cu", cg->kernels_cu) || write_file(dir, "model.c", cg->model_c) ||
         write_file(dir, "model.h", cg->model_h);
}

/* Quote for /bin/sh: paths come from the user (--output-dir, TMPDIR). */
static void quoted(char *out, size_t n, const char *s) {
  size_t k = 0;
  if (k < n) out[k++] = '\'';
  for (; *s && k + 5 < n; s++) {
    if (*s == '\'') { memcpy(out + k, "'\\''", 4); k += 4; }
    else out[k++] = *s;
  }
  if (k < n) out[k++] = '\'';
  out[k < n ? k : n - 1] = 0;
}

void *kiln_build_host(const kl_codegen_result *cg, const char *dir, const krt_model_api **api) {
  if (kiln_write_sources(cg, dir)) return NULL;
  const char *cc = getenv("KILN_CC");
  char qdir[4200], cmd[12000];
  quoted(qdir, sizeof qdir, dir);
  /* -fno-math-errno keeps the math functions free of errno (as on a GPU);
   * -O1 is enough for a test device and compiles fast. */
  snprintf(cmd, sizeof cmd,
           "%s -std=gnu11 -O1 -fno-math-errno -fPIC -shared -DKILN_HOST_KERNELS "
           "-I'%s' -I'%s/emu' -x c %s/kernels.cu -x c %s/model.c -o %s/model.so -lm "
           ">%s/build.log 2>&1",
           cc && *cc ? cc : "cc", KILN_RUNTIME_DIR, KILN_RUNTIME_DIR, qdir, qdir, qdir, qdir);
  int st = system(cmd);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "kiln: error: compiling the generated code for the host failed; see %s/build.log\n",
            dir);
    return NULL;
  }
  char so[4200];
  snprintf(so, sizeof so, "%s/model.so", dir);
  void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "kiln: error: loading %s: %s\n", so, dlerror());
    return NULL;
  }
  const krt_model_api *(*entry)(void) = (const krt_model_api *(*)(void))dlsym(h, "kiln_model");
  if (!entry) {
    fprintf(stderr, "kiln: error: %s has no kiln_model entry\n", so);
    dlclose(h);
    return NULL;
  }
  *api = entry();
  return h;
}
