/* build_host.c - turn generated sources into a loaded model for the host
 * device: write them to a folder, compile kernels.cu and model.c with the
 * host C compiler against runtime/emu (so the CUDA C kernels run on the
 * CPU), and load the shared object.  The runtime functions it calls are
 * those of this kiln executable (it exports them). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* weights.bin, streamed from where the weights lie (kl_codegen_write_weights):
 * with `timing`, how long it took and how fast. */
static int write_weights(const kl_codegen_result *cg, const char *dir, bool timing) {
  char path[4096];
  snprintf(path, sizeof path, "%s/weights.bin", dir);
  double t0 = krt_now_ms();
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  kl_error err;
  if (fd < 0) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = kl_codegen_write_weights(cg, fd, &err);
  if (close(fd) && !rc) rc = kl_fail(&err, (kl_loc){0}, "writing the weights failed: %s", strerror(errno));
  if (rc) {
    fprintf(stderr, "kiln: error: %s: %s\n", path, err.msg);
    return -1;
  }
  double ms = krt_now_ms() - t0;
  if (timing)
    fprintf(stderr, "kiln: time: weights.bin %.1f ms (%zu bytes, %.0f MB/s)\n", ms, cg->param_bytes,
            ms > 0 ? (double)cg->param_bytes / 1e3 / ms : 0.0);
  return 0;
}

int kiln_copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
  char buf[1 << 16];
  size_t n;
  int rc = in && out ? 0 : -1;
  while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0)
    if (fwrite(buf, 1, n, out) != n) rc = -1;
  if (in && ferror(in)) rc = -1;
  if (in) fclose(in);
  if (out && fclose(out)) rc = -1;
  if (rc) fprintf(stderr, "kiln: error: copying %s to %s failed: %s\n", from, to, strerror(errno));
  return rc;
}

/* kiln_prelude.h beside kernels.cu: with it the folder compiles on its own
 * (`nvcc -c kernels.cu`, no -I); on a GPU it includes CUDA's own headers
 * only. */
static int copy_prelude(const char *dir) {
  char from[4200], to[4200];
  snprintf(from, sizeof from, "%s/emu/kiln_prelude.h", kiln_runtime_dir());
  if (access(from, R_OK)) {
    fprintf(stderr, "kiln: error: the runtime's headers are not in %s (no emu/kiln_prelude.h): set "
                    "KILN_RUNTIME_DIR to the folder of kilnrt.h, or reinstall kiln\n", kiln_runtime_dir());
    return -1;
  }
  snprintf(to, sizeof to, "%s/kiln_prelude.h", dir);
  return kiln_copy_file(from, to);
}

int kiln_write_sources(const kl_codegen_result *cg, const char *dir, bool timing) {
  return write_file(dir, "kernels.cu", cg->kernels_cu) || write_file(dir, "model.c", cg->model_c) ||
         write_file(dir, cg->header, cg->model_h) || copy_prelude(dir) || write_weights(cg, dir, timing);
}

/* An installed kiln (meson install): PREFIX/bin/kiln beside
 * PREFIX/include/kiln/kilnrt.h and the libraries in PREFIX/LIBDIR, found
 * from where the program lies, so that the prefix may move; NULL for kiln
 * in its build folder. */
const char *kiln_installed_prefix(void) {
  static char prefix[4096];
  static int known; /* 0: not looked yet, 1: installed, -1: not */
  if (known) return known > 0 ? prefix : NULL;
  known = -1;
  char exe[4096], probe[4200];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return NULL;
  exe[n] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0; /* PREFIX/bin */
  if (!(slash = strrchr(exe, '/'))) return NULL;
  *slash = 0; /* PREFIX */
  snprintf(probe, sizeof probe, "%s/include/kiln/kilnrt.h", exe);
  if (access(probe, R_OK)) return NULL;
  snprintf(prefix, sizeof prefix, "%s", exe);
  known = 1;
  return prefix;
}

const char *kiln_runtime_dir(void) {
  /* absolute: the library build runs its compiler from another folder */
  static char abs[4200];
  const char *d = getenv("KILN_RUNTIME_DIR");
  if (d && *d) return realpath(d, abs) ? abs : d;
  const char *p = kiln_installed_prefix();
  if (!p) return KILN_RUNTIME_DIR;
  snprintf(abs, sizeof abs, "%s/include/kiln", p);
  return abs;
}


const char *kiln_c_compiler(void) {
  const char *cc = getenv("KILN_CC");
  return cc && *cc ? cc : "cc";
}

char *kiln_read_prelude(void) {
  char path[4200];
  snprintf(path, sizeof path, "%s/emu/kiln_prelude.h", kiln_runtime_dir());
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(1 << 20);
  size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
  fclose(f);
  if (buf) buf[n] = 0;
  return buf;
}

static void write_bytes(FILE *f, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) fprintf(f, "%s%u,", i % 24 ? "" : "\n  ", p[i]);
}

/* NVRTC for each architecture, written to dir/gpu_images.c. */
/* ---- progress -------------------------------------------------------------
 * A compile that takes more than a second says what it is doing, a line
 * per phase on stderr (a detector's NVRTC builds are seconds each); a
 * quick one prints nothing. */
static double progress_t0;       /* 0: off (kiln_progress_begin not called) */
static double progress_after = 1; /* s; KILN_PROGRESS_AFTER sets it (0: always) */

void kiln_progress_begin(void) {
  progress_t0 = krt_now_ms();
  const char *e = getenv("KILN_PROGRESS_AFTER");
  if (e && *e) progress_after = strtod(e, NULL);
}

void kiln_progress(const char *fmt, ...) {
  if (!progress_t0) return;
  double s = (krt_now_ms() - progress_t0) / 1e3;
  if (s < progress_after) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kiln: [%.1f s] ", s);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* kiln compile --time: what ptxas said of each kernel for sm_XX, summed
 * up on one line, and a line for each kernel that spills. */
static void report_resources(int arch, const char *log) {
  enum { CAP = 4096 };
  kl_kernel_resources *r = malloc(CAP * sizeof *r);
  if (!r) return;
  int n = kl_nvrtc_resources(log, r, CAP), most = 0;
  long spills = 0, stack = 0, shared = 0;
  for (int i = 0; i < n && i < CAP; i++) {
    if (r[i].registers > r[most].registers) most = i;
    spills += r[i].spill_bytes;
    stack = r[i].stack_bytes > stack ? r[i].stack_bytes : stack;
    shared = r[i].shared_bytes > shared ? r[i].shared_bytes : shared;
  }
  if (n > 0)
    fprintf(stderr, "kiln: resources sm_%d: %d kernels, registers at most %d (%s), %ld spill bytes, "
                    "stack at most %ld bytes, static shared memory at most %ld bytes\n",
            arch, n, r[most].registers, r[most].name, spills, stack, shared);
  for (int i = 0; i < n && i < CAP; i++)
    if (r[i].spill_bytes)
      fprintf(stderr, "kiln: resources sm_%d: kernel %s spills %ld bytes (%d registers)\n", arch, r[i].name,
              r[i].spill_bytes, r[i].registers);
  free(r);
}

int kiln_gpu_images(const kl_codegen_result *cg, const char *dir, const int *sm, int nsm,
                    bool werror, bool timing) {
  char *prelude = kiln_read_prelude();
  if (!prelude) {
    fprintf(stderr, "kiln: error: cannot read %s/emu/kiln_prelude.h\n", kiln_runtime_dir());
    return -1;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/gpu_images.c", dir);
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln: error: cannot write %s\n", path);
    free(prelude);
    return -1;
  }
  fprintf(f, "/* gpu_images.c - generated by kiln: kernels.cu compiled by NVRTC. */\n"
             "#include \"kilnrt.h\"\n");
  int rc = 0;
  for (int i = 0; i <= nsm && !rc; i++) {
    bool ptx = i == nsm; /* after the cubins, PTX for the newest architecture */
    int arch = ptx ? sm[nsm - 1] : sm[i];
    unsigned char *img;
    size_t len;
    char *log;
    kl_error err;
    double t0 = krt_now_ms();
    kiln_progress("NVRTC: %s_%d of %d kernels", ptx ? "compute" : "sm", arch, cg->nkernels);
    int flags = (ptx ? KL_NVRTC_PTX : 0) | (timing ? KL_NVRTC_RESOURCES : 0);
    if (kl_nvrtc_compile(cg->kernels_cu, prelude, arch, flags, &img, &len, &log, &err)) {
      kl_error_print(stderr, &err);
      rc = -1;
    } else {
      if (log && strstr(log, "warning")) {
        fprintf(stderr, "kiln: NVRTC warnings (%s_%d):\n%s\n", ptx ? "compute" : "sm", arch, log);
        if (werror) rc = -1;
      }
      if (timing)
        fprintf(stderr, "kiln: time: nvrtc %s_%d %.1f ms (%zu bytes)\n", ptx ? "compute" : "sm", arch,
                krt_now_ms() - t0, len);
      if (timing && !ptx) report_resources(arch, log);
      if (timing && ptx)
        fprintf(stderr, "kiln: resources compute_%d: %d f64 instructions in the PTX\n", arch,
                kl_ptx_f64_instructions((const char *)img));
      if (ptx) {
        fprintf(f, "const char kiln_ptx[] = {");
        write_bytes(f, img, len + 1);
        fprintf(f, "\n};\n");
      } else {
        fprintf(f, "static const unsigned char cubin_sm%d[] = {", arch);
        write_bytes(f, img, len);
        fprintf(f, "\n};\n");
      }
    }
    free(img);
    free(log);
  }
  fprintf(f, "const krt_cubin kiln_cubins[] = {\n");
  for (int i = 0; i < nsm; i++)
    fprintf(f, "  {%d, cubin_sm%d, sizeof cubin_sm%d},\n", sm[i], sm[i], sm[i]);
  fprintf(f, "};\nconst int kiln_ncubins = %d;\n", nsm);
  if (fclose(f)) rc = -1;
  free(prelude);
  return rc;
}

/* Quote for /bin/sh: paths come from the user (--output-dir, TMPDIR). */
void kiln_shell_quote(char *out, size_t n, const char *s) {
  size_t k = 0;
  if (k < n) out[k++] = '\'';
  for (; *s && k + 5 < n; s++) {
    if (*s == '\'') { memcpy(out + k, "'\\''", 4); k += 4; }
    else out[k++] = *s;
  }
  if (k < n) out[k++] = '\'';
  out[k < n ? k : n - 1] = 0;
}

/* The build folder is removed after a failure too, so the compiler's own
 * words go to stderr: its first lines, where the first error is. */
void kiln_report_build_log(const char *dir, const char *what) {
  fprintf(stderr, "kiln: error: %s failed", what);
  char path[4200], line[512];
  snprintf(path, sizeof path, "%s/build.log", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, " (no build.log in %s)\n", dir);
    return;
  }
  fprintf(stderr, "; the compiler said:\n");
  int n = 0;
  while (n < 30 && fgets(line, sizeof line, f)) {
    fprintf(stderr, "  %s%s", line, strchr(line, '\n') ? "" : "\n");
    n++;
  }
  if (fgets(line, sizeof line, f)) fprintf(stderr, "  ... (KILN_KEEP_BUILD=1 keeps %s)\n", path);
  fclose(f);
}

void kiln_remove_build_dir(const char *dir) {
  if (getenv("KILN_KEEP_BUILD")) {
    fprintf(stderr, "kiln: build folder kept: %s\n", dir);
    return;
  }
  char q[4200], cmd[4400];
  kiln_shell_quote(q, sizeof q, dir);
  snprintf(cmd, sizeof cmd, "rm -rf %s", q);
  if (system(cmd)) { /* best effort */ }
}

void *kiln_build_host(const kl_codegen_result *cg, const char *dir, int gpu_sm,
                      const krt_model_api **api) {
  if (kiln_write_sources(cg, dir, false)) return NULL;
  /* For the GPU here: NVRTC's cubin for its architecture (and PTX), in
   * gpu_images.c beside the host kernels. */
  bool gpu = gpu_sm > 0;
  if (gpu && cg->nkernels && kiln_gpu_images(cg, dir, &gpu_sm, 1, false, false)) return NULL;
  char qdir[4200], qrt[4200], cmd[65536];
  kiln_shell_quote(qdir, sizeof qdir, dir);
  kiln_shell_quote(qrt, sizeof qrt, kiln_runtime_dir());
  /* -fno-math-errno keeps the math functions free of errno (as on a GPU);
   * -O2 as the executables and libraries `kiln compile` writes, so that
   * `kiln bench` and `kiln profile` time the code users ship (the
   * vectoriser the host device's strip and virtual-lane kernels are
   * written for runs from -O2; it costs 0.1-0.2 s more a model). */
  /* -mf16c where this CPU has it: the code is for this process alone, and
   * f16 conversions become one instruction (the same bits, kiln_emu.h).
   * It brings AVX, whose 256-bit vectors made the host's tensor-core
   * convolution slower on the test VM (conv_block fp16 24 ms against 19
   * without AVX): the kernels were written for 16-byte vectors (14 ms). */
  const char *f16c = "";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("f16c")) f16c = "-mf16c -mprefer-vector-width=128 ";
#endif
  snprintf(cmd, sizeof cmd,
           "%s -std=gnu11 -O2 %s-fno-math-errno -fPIC -shared -DKILN_HOST_KERNELS "
           "%s -I%s -I%s/emu -DKILN_WEIGHTS_FILE='\"'%s/weights.bin'\"' "
           "-x c %s/kernels.cu -x c %s/model.c %s%s -o %s/model.so -lm >%s/build.log 2>&1",
           kiln_c_compiler(), f16c, gpu && cg->nkernels ? "-DKILN_GPU_IMAGES" : "", qrt, qrt, qdir,
           qdir, qdir, gpu && cg->nkernels ? qdir : "", gpu && cg->nkernels ? "/gpu_images.c" : "",
           qdir, qdir);
  int st = system(cmd);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    kiln_report_build_log(dir, "compiling the generated code for the host");
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
