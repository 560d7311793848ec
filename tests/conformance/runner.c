/* runner.c - the ONNX conformance suite (Debian's libonnx-testdata) through
 * Kiln: each test's model.onnx is loaded, every test_data_set_* is run and
 * compared with its output_*.pb at ONNX's backend tolerances (rtol 1e-3,
 * atol 1e-7).  Each test runs in a child process, so a crash or a hang is
 * one failed test, not a failed run.
 *
 * usage: conformance DATA_DIR [--suite NAME]... [--expected FILE]
 *                    [--known-failures FILE]
 *                    [--markdown FILE [--scope FILE | --append] [--title T]]
 *                    [--write-passing FILE]
 *                    [--filter SUBSTR] [--device host|cuda [--no-fuse] [--nvrtc]]
 *                    [--shard K/N] [-v]
 * --shard K/N runs every Nth test from the Kth (N processes side by side);
 * each guards only the tests it ran.  With --expected, a failed test (not
 * an unsupported one) must be in --known-failures with its reason. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "../../frontend/frontend.h"
#include "../../driver/driver.h"
#include "../../runtime/kilnrt.h"
#include "onnx.pb-c.h"

enum { PASS, FAIL, UNSUPPORTED, NOT_RUN };
static const char *const status_names[] = {"pass", "fail", "unsupported", "-"};

typedef struct {
  char suite[64];
  char name[256];
  char op[64];     /* first node's op type: the row it counts in */
  int status;
  char reason[512];
  int host_status;    /* compiled for the host device (when asked) */
  char host_reason[512];
  bool leak_unchecked; /* LeakSanitizer's check crashed (run_checked) */
} result;

/* --no-fuse: compile with one kernel per node */
static bool no_fuse;
/* --nvrtc: also compile each compiled test's kernels.cu with NVRTC for
 * sm_90; an error or a warning fails the test (read: the prelude text) */
static char *nvrtc_prelude;
/* --device host|cuda: also compile each passing test for that device */
static bool with_host;
static krt_device_kind compiled_kind = KRT_DEVICE_HOST;

static const double RTOL = 1e-3, ATOL = 1e-7;
enum { TEST_SECONDS = 120 };

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names in dir starting with prefix; returns the count. */
static int list_dir(const char *dir, const char *prefix, char ***out) {
  DIR *d = opendir(dir);
  *out = NULL;
  if (!d) return 0;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      *out = realloc(*out, (size_t)cap * sizeof **out);
      if (!*out) abort();
    }
    (*out)[n++] = strdup(e->d_name);
  }
  closedir(d);
  if (n) qsort(*out, (size_t)n, sizeof **out, cmp_str);
  return n;
}

static void free_list(char **l, int n) {
  for (int i = 0; i < n; i++) free(l[i]);
  free(l);
}

/* model.onnx unpacked (NULL when unreadable); free with
 * onnx__model_proto__free_unpacked. */
static Onnx__ModelProto *read_model(const char *model) {
  FILE *f = fopen(model, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(len > 0 ? (size_t)len : 1);
  Onnx__ModelProto *m = NULL;
  if (buf && len > 0 && fread(buf, 1, (size_t)len, f) == (size_t)len)
    m = onnx__model_proto__unpack(NULL, (size_t)len, buf);
  free(buf);
  fclose(f);
  return m;
}

static void first_op(const char *model, char *op, size_t n) {
  snprintf(op, n, "?");
  Onnx__ModelProto *m = read_model(model);
  if (m && m->graph && m->graph->n_node && m->graph->node[0]->op_type)
    snprintf(op, n, "%s", m->graph->node[0]->op_type);
  if (m) onnx__model_proto__free_unpacked(m, NULL);
}

/* The first graph input or output of `model` whose type is not a tensor
 * (a sequence, a map, an optional): its name into `name`; false if none. */
static bool non_tensor_io(const char *model, char *name, size_t n) {
  bool found = false;
  Onnx__ModelProto *m = read_model(model);
  const Onnx__GraphProto *g = m ? m->graph : NULL;
  for (size_t k = 0; g && !found && k < g->n_input + g->n_output; k++) {
    const Onnx__ValueInfoProto *v = k < g->n_input ? g->input[k] : g->output[k - g->n_input];
    int tc = v->type ? (int)v->type->value_case : ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    if (tc == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE || tc == ONNX__TYPE_PROTO__VALUE_MAP_TYPE ||
        tc == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE) {
      snprintf(name, n, "%s", v->name ? v->name : "?");
      found = true;
    }
  }
  if (m) onnx__model_proto__free_unpacked(m, NULL);
  return found;
}

/* ONNX's reference keeps the intermediates of a composite (an *_expanded
 * test) in the output's type, where Kiln computes each op in float64 and
 * rounds once: the two may differ by an ulp or two of a half type, more
 * than rtol 1e-3 allows.  Half outputs get two ulps: 2^-9 relative for
 * fp16 (10 mantissa bits), 2^-6 for bf16 (7). */
static double output_rtol(kl_dtype t) {
  if (t == KL_F16) return 0x1p-9;
  if (t == KL_BF16) return 0x1p-6;
  return RTOL;
}

static int compare(const kl_tensor *got, const kl_tensor *want, int k, char *why, size_t n) {
  char a[128], b[128];
  if (got->dtype != want->dtype || !kl_shape_equal(&got->shape, &want->shape)) {
    snprintf(why, n, "output %d is %s%s, expected %s%s", k, kl_dtype_name(got->dtype),
             kl_shape_str(&got->shape, a, sizeof a), kl_dtype_name(want->dtype),
             kl_shape_str(&want->shape, b, sizeof b));
    return -1;
  }
  int64_t bad = 0, first = -1;
  double rtol = output_rtol(got->dtype);
  /* ONNX's reference computes in the output's type, so a value that should
   * be 0 may carry the rounding of the largest one it was summed with (an
   * inverse DFT): one ulp of the largest expected magnitude is noise. */
  double atol = ATOL;
  if (kl_dtype_is_float(got->dtype)) {
    double largest = 0;
    for (int64_t i = 0; i < want->numel; i++)
      if (isfinite(want->data[i])) largest = fmax(largest, fabs(want->data[i]));
    double ulp = got->dtype == KL_F64 ? 0x1p-52 : got->dtype == KL_F32 ? 0x1p-23
               : got->dtype == KL_F16 ? 0x1p-10 : 0x1p-7;
    atol += ulp * largest;
  }
  for (int64_t i = 0; i < got->numel; i++) {
    double x = got->data[i], y = want->data[i];
    /* the small floats (fp8, fp4, E8M0) are exact: one rounding of f32 */
    bool ok = kl_dtype_is_float(got->dtype)
                  ? (isnan(x) && isnan(y)) || x == y || fabs(x - y) <= atol + rtol * fabs(y)
              : kl_dtype_is_small_float(got->dtype) ? (isnan(x) && isnan(y)) || x == y
                                                    : x == y;
    if (!ok && !bad++) first = i;
  }
  if (bad) {
    snprintf(why, n, "output %d: %lld of %lld values differ; first at %lld: got %.9g, expected %.9g",
             k, (long long)bad, (long long)got->numel, (long long)first, got->data[first],
             want->data[first]);
    return -1;
  }
  return 0;
}

/* Older ONNX test data stores bfloat16 tensors as UINT16 bit patterns. */
static void bf16_from_bits(kl_tensor *t, kl_dtype want) {
  if (t->dtype != KL_U16 || want != KL_BF16) return;
  for (int64_t i = 0; i < t->numel; i++) t->data[i] = krt_bf16_to_f32((uint16_t)t->data[i]);
  t->dtype = KL_BF16;
}

enum { MAX_INPUTS = 64 };

/* The same data set compiled for the host device: codegen, the host C
 * compiler, the runtime; compared with the expected outputs as the
 * interpreter's were. */
static void run_host(const kl_graph *g, kl_tensor **in, const char *dir, const char *set,
                     result *r) {
  kl_codegen_result cg;
  kl_error err;
  kiln_compile_opts opt = {.prefix = "model", .no_fuse = no_fuse};
  if (kiln_generate_err(g, &opt, &cg, &err)) {
    r->host_status = err.unsupported ? UNSUPPORTED : FAIL;
    snprintf(r->host_reason, sizeof r->host_reason, "%s", err.msg);
    return;
  }
  char bdir[] = "/tmp/kiln-conf-XXXXXX", msg[1024], path[4600];
  const krt_model_api *api = NULL;
  /* the device first: a GPU's code is built for its architecture */
  krt_device *dev = NULL;
  bool opened = !krt_device_open(compiled_kind, &dev, msg, sizeof msg);
  void *h = opened && mkdtemp(bdir) ? kiln_build_host(&cg, bdir, krt_device_sm(dev), &api) : NULL;
  void *model = NULL;
  int nin = g->inputs.len, nout = g->outputs.len;
  void **rin = calloc((size_t)nin + 1, sizeof *rin), **rout = calloc((size_t)nout + 1, sizeof *rout);
  r->host_status = FAIL;
  if (!opened) snprintf(r->host_reason, sizeof r->host_reason, "%s", msg);
  else if (!h) snprintf(r->host_reason, sizeof r->host_reason, "the generated code did not build");
  else if (api->create(dev, &model, msg, sizeof msg))
    snprintf(r->host_reason, sizeof r->host_reason, "%s", msg);
  else {
    for (int i = 0; i < nin; i++) {
      rin[i] = malloc((size_t)in[i]->numel * kl_dtype_size(in[i]->dtype) + 1);
      kl_tensor_to_raw(in[i], rin[i]);
    }
    for (int i = 0; i < nout; i++)
      rout[i] = malloc((size_t)kl_shape_numel(&g->outputs.items[i]->shape) *
                           kl_dtype_size(g->outputs.items[i]->dtype) + 1);
    if (api->run(model, (const void *const *)rin, rout, msg, sizeof msg)) {
      snprintf(r->host_reason, sizeof r->host_reason, "%s: %s", set, msg);
    } else {
      r->host_status = PASS;
      for (int k = 0; k < nout && r->host_status == PASS; k++) {
        kl_tensor *got = kl_tensor_new(g->outputs.items[k]->dtype, &g->outputs.items[k]->shape);
        kl_tensor_from_raw(got, rout[k]);
        snprintf(path, sizeof path, "%s/%s/output_%d.pb", dir, set, k);
        kl_tensor *want = kl_read_tensor_pb(path, &err);
        if (want) bf16_from_bits(want, got->dtype);
        if (!want || compare(got, want, k, r->host_reason, sizeof r->host_reason))
          r->host_status = FAIL;
        kl_tensor_free(got);
        kl_tensor_free(want);
      }
    }
  }
  if (model) api->destroy(model);
  krt_device_close(dev);
  for (int i = 0; i < nin; i++) free(rin[i]);
  for (int i = 0; i < nout; i++) free(rout[i]);
  free(rin);
  free(rout);
  if (r->host_status == PASS && nvrtc_prelude) {
    unsigned char *img = NULL;
    size_t len;
    char *log = NULL;
    if (kl_nvrtc_compile(cg.kernels_cu, nvrtc_prelude, 90, false, &img, &len, &log, &err)) {
      r->host_status = FAIL;
      snprintf(r->host_reason, sizeof r->host_reason, "NVRTC sm_90: %s", err.msg);
    } else if (log && strstr(log, "warning")) {
      r->host_status = FAIL;
      snprintf(r->host_reason, sizeof r->host_reason, "NVRTC sm_90 warns: %s", log);
    }
    free(img);
    free(log);
  }
  kl_codegen_result_free(&cg);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", bdir);
  if (system(cmd)) { /* best effort */ }
}

/* Run one test in this (child) process; the verdict goes to `r`. */
static void run_test(const char *dir, result *r) {
  char model[4500], path[4600];
  static char names[MAX_INPUTS][256];
  snprintf(model, sizeof model, "%s/model.onnx", dir);
  kl_error nerr;
  int nnames = kl_onnx_input_names(model, names, MAX_INPUTS, &nerr);
  if (nnames < 0) nnames = 0;
  char **sets;
  int nsets = list_dir(dir, "test_data_set_", &sets);
  r->status = nsets ? PASS : FAIL;
  char io[256];
  /* ONNX writes no tensor data for sequence/map/optional values, so such a
   * test has no data sets: out of scope, not broken. */
  if (!nsets && non_tensor_io(model, io, sizeof io)) {
    r->status = UNSUPPORTED;
    snprintf(r->reason, sizeof r->reason,
             "'%s' is not a tensor: sequence/optional types are out of scope", io);
  } else if (!nsets) {
    snprintf(r->reason, sizeof r->reason, "no test_data_set_* folders");
  }
  for (int s = 0; s < nsets && r->status == PASS; s++) {
    kl_tensor *data[MAX_INPUTS] = {0};
    bool frozen[MAX_INPUTS] = {0};
    kl_error err;
    for (int k = 0; k < nnames; k++) {
      snprintf(path, sizeof path, "%s/%s/input_%d.pb", dir, sets[s], k);
      if (access(path, F_OK) == 0 && !(data[k] = kl_read_tensor_pb(path, &err))) {
        /* A model whose inputs Kiln cannot take (a sequence, an optional)
         * has test data that is no TensorProto either: say why. */
        kl_onnx_options plain = {0};
        kl_error lerr;
        kl_graph *g = kl_onnx_load(model, &plain, &lerr);
        kl_graph_free(g);
        bool unsup = err.unsupported || (!g && lerr.unsupported);
        r->status = unsup ? UNSUPPORTED : FAIL;
        snprintf(r->reason, sizeof r->reason, "%s: %s", sets[s], !g && lerr.unsupported ? lerr.msg : err.msg);
        break;
      }
    }
    kl_onnx_options opt = {0};
    const char *name_ptrs[MAX_INPUTS];
    for (int k = 0; k < nnames; k++) name_ptrs[k] = names[k];
    kl_graph *g = r->status == PASS
                      ? kl_onnx_load_for_inputs(model, name_ptrs, data, nnames, frozen, &opt, &err)
                      : NULL;
    if (r->status == PASS && !g) {
      r->status = opt.unsupported_only ? UNSUPPORTED : FAIL;
      snprintf(r->reason, sizeof r->reason, "%s", err.msg);
      for (char *p = r->reason; *p; p++) if (*p == '\n') *p = ' ';
    }
    kl_tensor **in = NULL, **out = NULL;
    if (g) {
      in = calloc((size_t)g->inputs.len + 1, sizeof *in);
      out = calloc((size_t)g->outputs.len + 1, sizeof *out);
      int used = 0;
      for (int k = 0; k < nnames; k++) {
        if (frozen[k]) continue;
        if (used < g->inputs.len) {
          in[used] = data[k];
          if (in[used]) bf16_from_bits(in[used], g->inputs.items[used]->dtype);
        }
        used++;
      }
      if (used != g->inputs.len) {
        r->status = FAIL;
        snprintf(r->reason, sizeof r->reason, "%s: %d input files for %d inputs", sets[s], used,
                 g->inputs.len);
      }
    }
    if (g && r->status == PASS && kl_interpret(g, in, out, &err)) {
      r->status = FAIL;
      snprintf(r->reason, sizeof r->reason, "%s: %s", sets[s], err.msg);
    }
    for (int k = 0; g && k < g->outputs.len && r->status == PASS; k++) {
      snprintf(path, sizeof path, "%s/%s/output_%d.pb", dir, sets[s], k);
      kl_tensor *want = kl_read_tensor_pb(path, &err);
      if (want) bf16_from_bits(want, out[k]->dtype);
      if (!want) {
        r->status = FAIL;
        snprintf(r->reason, sizeof r->reason, "%s: %s", sets[s], err.msg);
      } else if (compare(out[k], want, k, r->reason, sizeof r->reason)) {
        r->status = FAIL;
      }
      kl_tensor_free(want);
    }
    if (with_host && g && r->status == PASS && r->host_status != FAIL &&
        r->host_status != UNSUPPORTED)
      run_host(g, in, dir, sets[s], r);
    for (int k = 0; k < nnames; k++) kl_tensor_free(data[k]);
    for (int k = 0; g && k < g->outputs.len; k++) kl_tensor_free(out[k]);
    free(in);
    free(out);
    kl_graph_free(g);
  }
  free_list(sets, nsets);
}

/* A child ends with _exit (the parent's buffers and atexit handlers are
 * not its own), which skips LeakSanitizer's check at exit: run it here.
 * KILN_TEST_INJECT_LEAK (tests/conformance/test_leak_check.sh) drops a
 * block first, to show that a leak fails the test; KILN_TEST_LEAK_CHECK_DIES
 * ends the child as a crashed check does (run_checked). */
enum { LEAK_EXIT = 23 };
static void *volatile injected_leak;

static bool child_leaked(void) {
  if (getenv("KILN_TEST_LEAK_CHECK_DIES")) _exit(1); /* as LeakSanitizer's Die() */
  if (getenv("KILN_TEST_INJECT_LEAK")) {
    injected_leak = malloc(100);
    injected_leak = NULL;
  }
#if defined(__SANITIZE_ADDRESS__)
  return __lsan_do_recoverable_leak_check() != 0;
#else
  return false;
#endif
}

static void run_isolated(const char *dir, result *r);

/* LeakSanitizer's tracer has been seen to crash ("Tracer caught signal
 * 11", a few children in a thousand, only on a loaded machine) after the
 * child had written its result: exit status 1 with a whole result.  That
 * is the check failing to run, not a leak: the test runs once more, and
 * if the check crashes again its results stand and the leak check counts
 * as skipped, with that reason (tests/skip_reasons.txt). */
static int leak_checks_skipped;

static void run_checked(const char *dir, result *r) {
  run_isolated(dir, r);
  if (r->leak_unchecked) {
    fprintf(stderr, "conformance: %s: LeakSanitizer's check crashed; running the test again\n", dir);
    run_isolated(dir, r);
  }
  if (r->leak_unchecked) {
    leak_checks_skipped++;
    printf("SKIP leak check of %s/%s: LeakSanitizer's tracer crashed twice (the results stand)\n",
           r->suite, r->name);
  }
}

static void run_isolated(const char *dir, result *r) {
  int fds[2];
  if (pipe(fds)) abort();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm(TEST_SECONDS);
    run_test(dir, r);
    ssize_t w = write(fds[1], r, sizeof *r);
    _exit(w != (ssize_t)sizeof *r ? 1 : child_leaked() ? LEAK_EXIT : 0);
  }
  close(fds[1]);
  result got;
  ssize_t n = read(fds[0], &got, sizeof got);
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  bool check_died = n == (ssize_t)sizeof got && WIFEXITED(st) && WEXITSTATUS(st) == 1;
  r->leak_unchecked = check_died;
  if (n == (ssize_t)sizeof got && WIFEXITED(st) && (WEXITSTATUS(st) == 0 || check_died)) {
    r->status = got.status;
    memcpy(r->reason, got.reason, sizeof r->reason);
    r->host_status = got.host_status;
    memcpy(r->host_reason, got.host_reason, sizeof r->host_reason);
  } else {
    r->status = FAIL;
    if (WIFSIGNALED(st))
      snprintf(r->reason, sizeof r->reason, "%s (signal %d)",
               WTERMSIG(st) == SIGALRM ? "timed out" : "crashed", WTERMSIG(st));
    else if (WIFEXITED(st) && WEXITSTATUS(st) == LEAK_EXIT)
      snprintf(r->reason, sizeof r->reason, "leaked memory (LeakSanitizer's report is on stderr)");
    else
      snprintf(r->reason, sizeof r->reason, "the test process exited with %d (a sanitizer report?)",
               WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  }
}

typedef struct {
  char op[64];
  int count[3];
  int host_pass;
} op_row;

/* --title T: the heading of the results (a second suite appended to the
 * same page with --append needs its own) */
static const char *results_title = "Results";
static bool append_markdown;

static void write_markdown(const char *path, const char *scope, result *rs, int n,
                           char suites[][64], int nsuites) {
  FILE *f = fopen(path, append_markdown ? "a" : "w");
  if (!f) { perror(path); exit(2); }
  FILE *sf = scope && !append_markdown ? fopen(scope, "r") : NULL;
  if (sf) {
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, sf)) > 0) fwrite(buf, 1, got, f);
    fclose(sf);
  }
  fprintf(f, "\n## %s (generated by tests/conformance/runner.c; do not edit by hand)\n\n",
          results_title);
  fprintf(f, "Device: interp (the reference interpreter). Tolerance: rtol %g (two ulps for fp16 "
             "and bf16 outputs: %g, %g), atol %g plus one ulp of the largest expected "
             "magnitude.\n\n", RTOL, output_rtol(KL_F16),
          output_rtol(KL_BF16), ATOL);
  fprintf(f, "| suite | tests | pass | fail | unsupported | pass rate | host device: pass / fail / not compiled yet |\n"
             "|---|---|---|---|---|---|---|\n");
  for (int s = 0; s < nsuites; s++) {
    int c[3] = {0}, t = 0;
    for (int i = 0; i < n; i++)
      if (!strcmp(rs[i].suite, suites[s])) c[rs[i].status]++, t++;
    int h[4] = {0};
    for (int i = 0; i < n; i++)
      if (!strcmp(rs[i].suite, suites[s]) && rs[i].status == PASS) h[rs[i].host_status]++;
    fprintf(f, "| %s | %d | %d | %d | %d | %.1f%% | ", suites[s], t, c[PASS], c[FAIL],
            c[UNSUPPORTED], t ? 100.0 * c[PASS] / t : 0.0);
    if (with_host) fprintf(f, "%d / %d / %d |\n", h[PASS], h[FAIL], h[UNSUPPORTED]);
    else fprintf(f, "not run |\n");
  }
  fprintf(f, "\n### Per op (node suite; a test counts under its first node's op)\n\n");
  fprintf(f, "| op | tests | pass | fail | unsupported | host device pass |\n"
             "|---|---|---|---|---|---|\n");
  op_row *rows = calloc((size_t)n + 1, sizeof *rows);
  int nrows = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(rs[i].suite, "node")) continue;
    int j = 0;
    while (j < nrows && strcmp(rows[j].op, rs[i].op)) j++;
    if (j == nrows) snprintf(rows[nrows++].op, sizeof rows[0].op, "%s", rs[i].op);
    rows[j].count[rs[i].status]++;
    rows[j].host_pass += rs[i].status == PASS && rs[i].host_status == PASS;
  }
  for (int a = 0; a < nrows; a++)
    for (int b = a + 1; b < nrows; b++)
      if (strcmp(rows[a].op, rows[b].op) > 0) { op_row t = rows[a]; rows[a] = rows[b]; rows[b] = t; }
  for (int j = 0; j < nrows; j++)
  {
    fprintf(f, "| %s | %d | %d | %d | %d | ", rows[j].op,
            rows[j].count[0] + rows[j].count[1] + rows[j].count[2], rows[j].count[PASS],
            rows[j].count[FAIL], rows[j].count[UNSUPPORTED]);
    if (with_host) fprintf(f, "%d |\n", rows[j].host_pass);
    else fprintf(f, "not run |\n");
  }
  free(rows);
  fprintf(f, "\n### Tests that do not pass\n\n| test | status | reason |\n|---|---|---|\n");
  for (int i = 0; i < n; i++) {
    if (rs[i].status == PASS) continue;
    char reason[200];
    snprintf(reason, sizeof reason, "%s", rs[i].reason);
    for (char *p = reason; *p; p++) if (*p == '|') *p = '/';
    fprintf(f, "| %s/%s | %s | %s |\n", rs[i].suite, rs[i].name, status_names[rs[i].status], reason);
  }
  fclose(f);
}

/* Tests that fail (a wrong value or a refused input; not an unsupported
 * op) outside the guard list: each must be listed in the known failures
 * (`suite/test: reason`), printed XFAIL with its reason, or it is an
 * unexpected failure; a listed test that passes must leave the list. */
static int known_failures(const char *path, const result *rs, int n, const char *filter, int *xfails,
                          int *unexpected) {
  enum { MAX_KNOWN = 256 };
  char (*names)[400] = calloc(MAX_KNOWN, sizeof *names), (*why)[400] = calloc(MAX_KNOWN, sizeof *why);
  int nknown = 0;
  if (!names || !why) abort();
  FILE *f = path ? fopen(path, "r") : NULL;
  if (path && !f) { perror(path); free(names); free(why); return -1; }
  char line[900];
  while (f && fgets(line, sizeof line, f) && nknown < MAX_KNOWN) {
    line[strcspn(line, "\r\n")] = 0;
    char *colon = strstr(line, ": ");
    if (!*line || line[0] == '#' || !colon) continue;
    *colon = 0;
    snprintf(names[nknown], sizeof names[0], "%s", line);
    snprintf(why[nknown++], sizeof why[0], "%s", colon + 2);
  }
  if (f) fclose(f);
  for (int i = 0; i < n; i++) {
    char full[400];
    snprintf(full, sizeof full, "%s/%s", rs[i].suite, rs[i].name);
    int k = 0;
    while (k < nknown && strcmp(names[k], full)) k++;
    if (rs[i].status == FAIL && k < nknown) {
      ++*xfails;
      printf("XFAIL %s: %s (known: %s)\n", full, rs[i].reason, why[k]);
    } else if (rs[i].status == FAIL) {
      ++*unexpected;
      printf("UNEXPECTED FAIL %s: %s (not in %s)\n", full, rs[i].reason, path ? path : "a known-failures list");
    } else if (rs[i].status == PASS && k < nknown && (!filter || strstr(full, filter))) {
      ++*unexpected;
      printf("KNOWN FAILURE PASSES %s: take it off %s\n", full, path);
    }
  }
  free(names);
  free(why);
  return 0;
}

int main(int argc, char **argv) {
  /* the mutation check (tests/meta/test_mutation.sh): a wrong kernel for
   * one op, as kiln_test_break makes, must fail the host runs */
  const char *broken = getenv("KILN_TEST_BREAK_OP"), *scale = getenv("KILN_TEST_BREAK_SCALE");
  if (broken && *broken) kl_cg_test_break_op = broken;
  if (scale && *scale) kl_cg_test_break_scale = strtod(scale, NULL);
  if (argc < 2) {
    fprintf(stderr, "usage: conformance DATA_DIR [--suite NAME]... [--expected FILE] [--known-failures FILE] "
                    "[--markdown FILE [--scope FILE | --append] [--title T]] [--write-passing FILE] [--filter S] "
                    "[--shard K/N] [-v]\n");
    return 2;
  }
  const char *data = argv[1], *expected = NULL, *known = NULL, *markdown = NULL, *scope = NULL,
             *write_passing = NULL, *filter = NULL;
  char suites[8][64];
  int nsuites = 0;
  bool verbose = false;
  int shard = 0, nshards = 1; /* --shard K/N: every Nth test from the Kth */
  for (int i = 2; i < argc; i++) {
    const char *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--suite") && next && nsuites < 8) snprintf(suites[nsuites++], 64, "%s", argv[++i]);
    else if (!strcmp(argv[i], "--expected") && next) expected = argv[++i];
    else if (!strcmp(argv[i], "--known-failures") && next) known = argv[++i];
    else if (!strcmp(argv[i], "--markdown") && next) markdown = argv[++i];
    else if (!strcmp(argv[i], "--scope") && next) scope = argv[++i];
    else if (!strcmp(argv[i], "--title") && next) results_title = argv[++i];
    else if (!strcmp(argv[i], "--append")) append_markdown = true;
    else if (!strcmp(argv[i], "--write-passing") && next) write_passing = argv[++i];
    else if (!strcmp(argv[i], "--filter") && next) filter = argv[++i];
    else if (!strcmp(argv[i], "--shard") && next) {
      if (sscanf(argv[++i], "%d/%d", &shard, &nshards) != 2 || nshards < 1 || shard < 0 ||
          shard >= nshards) {
        fprintf(stderr, "conformance: --shard wants K/N with 0 <= K < N, not '%s'\n", argv[i]);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "-v")) verbose = true;
    else if (!strcmp(argv[i], "--no-fuse")) no_fuse = true;
    else if (!strcmp(argv[i], "--nvrtc")) {
      char why[300];
      nvrtc_prelude = kiln_read_prelude();
      if (!kl_nvrtc_available(why, sizeof why) || !nvrtc_prelude) {
        fprintf(stderr, "conformance: --nvrtc: %s\n", nvrtc_prelude ? why : "no kiln_prelude.h");
        free(nvrtc_prelude);
        return 2;
      }
    }
    else if (!strcmp(argv[i], "--device") && next &&
             krt_device_kind_parse(next, &compiled_kind) == 0 && compiled_kind != KRT_DEVICE_AUTO)
      with_host = true, i++;
    else { fprintf(stderr, "conformance: unknown argument '%s'\n", argv[i]); return 2; }
  }
  if (!nsuites) {
    const char *dflt[] = {"node", "pytorch-converted", "pytorch-operator", "simple"};
    for (int s = 0; s < 4; s++) snprintf(suites[nsuites++], 64, "%s", dflt[s]);
  }
  result *rs = NULL;
  int n = 0, cap = 0, seq = 0;
  for (int s = 0; s < nsuites; s++) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", data, suites[s]);
    char **tests;
    int nt = list_dir(dir, "test_", &tests);
    if (!nt) {
      fprintf(stderr, "conformance: no tests in %s\n", dir);
      free(rs);
      return 2;
    }
    for (int t = 0; t < nt; t++) {
      if (filter && !strstr(tests[t], filter)) continue;
      if (seq++ % nshards != shard) continue;
      if (n == cap) {
        cap = cap ? 2 * cap : 1024;
        rs = realloc(rs, (size_t)cap * sizeof *rs);
        if (!rs) abort();
      }
      result *r = &rs[n++];
      memset(r, 0, sizeof *r);
      r->host_status = NOT_RUN;
      snprintf(r->suite, sizeof r->suite, "%s", suites[s]);
      snprintf(r->name, sizeof r->name, "%s", tests[t]);
      char tdir[4400], model[4500];
      snprintf(tdir, sizeof tdir, "%s/%s", dir, tests[t]);
      snprintf(model, sizeof model, "%s/model.onnx", tdir);
      first_op(model, r->op, sizeof r->op);
      run_checked(tdir, r);
      if (verbose || r->status == FAIL)
        printf("%-11s %s/%s%s%s\n", status_names[r->status], r->suite, r->name,
               r->status == PASS ? "" : ": ", r->status == PASS ? "" : r->reason);
      if (with_host && r->status == PASS && (verbose || r->host_status == FAIL))
        printf("host %-6s %s/%s%s%s\n", status_names[r->host_status], r->suite, r->name,
               r->host_status == PASS ? "" : ": ", r->host_status == PASS ? "" : r->host_reason);
    }
    free_list(tests, nt);
  }
  /* summary per suite */
  printf("\n%-20s %6s %6s %6s %12s %8s%s\n", "suite", "tests", "pass", "fail", "unsupported", "rate",
         with_host ? "   host pass / fail / not compiled yet" : "");
  int total[3] = {0};
  for (int s = 0; s < nsuites; s++) {
    int c[3] = {0}, t = 0;
    for (int i = 0; i < n; i++)
      if (!strcmp(rs[i].suite, suites[s])) c[rs[i].status]++, t++;
    for (int k = 0; k < 3; k++) total[k] += c[k];
    printf("%-20s %6d %6d %6d %12d %7.1f%%", suites[s], t, c[PASS], c[FAIL], c[UNSUPPORTED],
           t ? 100.0 * c[PASS] / t : 0.0);
    if (with_host) {
      int h[4] = {0};
      for (int i = 0; i < n; i++)
        if (!strcmp(rs[i].suite, suites[s]) && rs[i].status == PASS) h[rs[i].host_status]++;
      printf("   %d / %d / %d", h[PASS], h[FAIL], h[UNSUPPORTED]);
    }
    printf("\n");
  }
  if (markdown) write_markdown(markdown, scope, rs, n, suites, nsuites);
  if (write_passing) {
    FILE *f = fopen(write_passing, "w");
    if (!f) { perror(write_passing); return 2; }
    for (int i = 0; i < n; i++)
      if (rs[i].status == PASS) fprintf(f, "%s/%s\n", rs[i].suite, rs[i].name);
    for (int i = 0; with_host && i < n; i++) /* the host device's guard */
      if (rs[i].status == PASS && rs[i].host_status == PASS)
        fprintf(f, "host:%s/%s\n", rs[i].suite, rs[i].name);
    fclose(f);
  }
  /* The regression guard: every test in the expected list must pass. */
  int regressions = 0, guarded = 0;
  if (expected) {
    FILE *f = fopen(expected, "r");
    if (!f) { perror(expected); return 2; }
    char line[512];
    while (fgets(line, sizeof line, f)) {
      line[strcspn(line, "\r\n")] = 0;
      if (!*line || line[0] == '#') continue;
      if (filter && !strstr(line, filter)) continue;
      bool host = !strncmp(line, "host:", 5);
      if (host && !with_host) continue;
      const char *test = host ? line + 5 : line;
      bool found = false, passed = false;
      for (int i = 0; i < n && !found; i++) {
        char full[400];
        snprintf(full, sizeof full, "%s/%s", rs[i].suite, rs[i].name);
        if (!strcmp(full, test))
          found = true, passed = host ? rs[i].status == PASS && rs[i].host_status == PASS
                                      : rs[i].status == PASS;
      }
      bool in_suites = false;
      for (int s = 0; s < nsuites; s++)
        in_suites |= !strncmp(test, suites[s], strlen(suites[s])) && test[strlen(suites[s])] == '/';
      /* a shard guards its own tests only */
      if (!in_suites || (nshards > 1 && !found)) continue;
      guarded++;
      if (!passed) {
        regressions++;
        printf("REGRESSION %s: %s\n", line, found ? "no longer passes" : "test not found");
      }
    }
    fclose(f);
  }
  /* The compiled model must match wherever the interpreter does: a test the
   * interpreter passes and the device does not (failed, or not compiled
   * yet) is a failure whether or not the list names it yet. */
  int host_mismatches = 0;
  for (int i = 0; with_host && expected && i < n; i++)
    if (rs[i].status == PASS && rs[i].host_status != PASS) {
      host_mismatches++;
      printf("HOST MISMATCH %s/%s: the interpreter passes, the device %s\n", rs[i].suite,
             rs[i].name, rs[i].host_status == FAIL ? "fails" : "did not compile it");
    }
  guarded += host_mismatches, regressions += host_mismatches;
  int unexpected = 0, xfails = 0;
  if (expected && known_failures(known, rs, n, filter, &xfails, &unexpected)) return 2;
  guarded += unexpected, regressions += unexpected;
  printf("conformance: %d passed, %d failed, %d unsupported", total[PASS], total[FAIL], total[UNSUPPORTED]);
  if (expected) printf("; %d guarded, %d regressions; %d known failures", guarded, regressions, xfails);
  printf("\n");
  /* The closing line counts the guard: each guarded test is one check. */
  if (expected)
    printf("%d passed, %d failed%s", guarded - regressions, regressions, leak_checks_skipped ? "" : "\n");
  if (expected && leak_checks_skipped) printf(", %d skipped\n", leak_checks_skipped);
  free(rs);
  free(nvrtc_prelude);
  return regressions ? 1 : 0;
}
