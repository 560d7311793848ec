/* nvrtc_check.c - compile a CUDA C file with NVRTC for sm_90 and fail on any
 * error or warning.  This is the "kernels.cu also builds for the GPU" half of
 * the emulator tests; it needs libnvrtc but no GPU.
 *
 * usage: nvrtc_check FILE.cu [NVRTC OPTION...]
 * e.g.   nvrtc_check tests/emu/emu_kernels.cu -Iruntime/emu
 * Prints the log and the PTX size; exit 0 only with an empty log. */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
    buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

#define CHECK(call)                                                         \
  do {                                                                      \
    nvrtcResult r_ = (call);                                                \
    if (r_ != NVRTC_SUCCESS) {                                              \
      fprintf(stderr, "%s: %s failed: %s\n", path, #call, nvrtcGetErrorString(r_)); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE.cu [NVRTC OPTION...]\n", argv[0]);
    return 2;
  }
  const char *path = argv[1];
  char *src = read_file(path);
  if (!src) {
    perror(path);
    return 1;
  }
  /* -default-device: every function without a space qualifier is __device__,
   * as the code generator's output expects.  -Wall is not an NVRTC option;
   * NVRTC prints its warnings by default and we treat any as a failure. */
  enum { MAX_OPTS = 64 };
  const char *opts[MAX_OPTS] = {"--gpu-architecture=sm_90", "-default-device",
                                "--std=c++17"};
  int nopt = 3;
  const char *arch = "sm_90";
  for (int i = 2; i < argc && nopt < MAX_OPTS; i++) {
    if (!strncmp(argv[i], "--gpu-architecture=", 19)) /* replaces sm_90 */
      opts[0] = argv[i], arch = argv[i] + 19;
    else
      opts[nopt++] = argv[i];
  }

  nvrtcProgram prog;
  CHECK(nvrtcCreateProgram(&prog, src, path, 0, NULL, NULL));
  nvrtcResult res = nvrtcCompileProgram(prog, nopt, opts);
  size_t logsz = 0;
  CHECK(nvrtcGetProgramLogSize(prog, &logsz));
  char *log = malloc(logsz + 1);
  CHECK(nvrtcGetProgramLog(prog, log));
  log[logsz] = '\0';
  int bad = res != NVRTC_SUCCESS || strspn(log, " \t\r\n") != strlen(log);
  if (bad) fprintf(stderr, "%s: NVRTC %s:\n%s\n", path, nvrtcGetErrorString(res), log);
  if (res == NVRTC_SUCCESS) {
    size_t ptxsz = 0;
    CHECK(nvrtcGetPTXSize(prog, &ptxsz));
    printf("%s: NVRTC %s ok, PTX %zu bytes%s\n", path, arch, ptxsz, bad ? " (with warnings)" : "");
  }
  free(log);
  nvrtcDestroyProgram(&prog);
  free(src);
  return bad;
}
