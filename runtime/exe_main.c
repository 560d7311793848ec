/* exe_main.c - the command line of a standalone compiled model (`kiln
 * compile --emit=exe`): read the inputs (.npy, and ONNX .pb when the program
 * links libkilnrt_pb), check them against the model's signature, run on a
 * device, time the runs, and write or summarise the outputs.  The generated
 * main() is one call to krt_exe_main (or krt_exe_main_pb) with the model's
 * krt_model_api. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exe_main.h"

enum { EXIT_USAGE = 2, MAX_FILES = 256 };
enum { OPT_INPUT = 1000, OPT_INPUTS_DIR, OPT_OUTPUT_DIR, OPT_DEVICE, OPT_ITERS, OPT_SEED, OPT_PROFILE, OPT_NO_GRAPH };

/* What a program built without libkilnrt_pb says about a .pb input. */
#define PB_HINT                                                                         \
  "convert to .npy, run the model with `kiln run`, or build the program with "          \
  "`kiln compile --emit=exe --pb-inputs`"

typedef struct {
  const char *prog;
  const krt_model_api *api;
  krt_tensor_reader pb_read;  /* NULL: the program reads no .pb */
  const char *names[MAX_FILES], *paths[MAX_FILES]; /* --input NAME=FILE */
  int nfiles;
  const char *inputs_dir, *output_dir;
  krt_device_kind device;
  long iters;
  uint64_t seed;              /* of inputs not given (input i: seed + i) */
  const char *profile;        /* --profile FILE.json: a Chrome trace */
  int no_graph;               /* --no-graph: plain launches on a GPU */
} exe_opts;

static const char *shape_text(krt_dtype t, int rank, const int64_t *dims, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "%s[", krt_dtype_name(t));
  for (int d = 0; d < rank && k < n; d++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)dims[d]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

static void usage(FILE *f, const exe_opts *o) {
  const krt_model_api *a = o->api;
  char s[200];
  fprintf(f, "usage: %s [--input NAME=FILE ...] [--inputs-dir DIR] [--output-dir DIR]\n"
             "       [--device auto|host|cuda] [--iters N] [--seed S] [--profile FILE.json]\n"
             "       [--no-graph]\n"
             "Run the compiled model '%s' and print the device and the median time per run.\n"
             "  --input NAME=FILE  feed input NAME from a %s file (repeatable)\n"
             "  --inputs-dir DIR   read %s for input K\n"
             "  --output-dir DIR   write output_K.npy for output K (made if absent);\n"
             "                     without it, a summary of each output is printed\n"
             "  --device DEV       auto (a GPU when one works, else the host; the default),\n"
             "                     host or cuda; KILN_DEVICE=host|cuda|auto overrides auto\n"
             "  --iters N          timed runs after one warm-up run (default 1, no warm-up)\n"
             "  --profile FILE     write a Chrome trace of the runs (Perfetto opens it): one\n"
             "                     event per kernel or library call, named after its fusion\n"
             "                     group and nodes; and print a table of them at the end\n"
             "                     (profiled runs launch kernels one by one)\n"
             "  --no-graph         on a GPU, launch the kernels one by one instead of\n"
             "                     replaying the run captured as a CUDA graph\n"
             "  --seed S           an input not given is filled with seeded random values, as\n"
             "                     `kiln run` fills it (input K from seed S + K; default 0)\n"
             "  -h, --help         this help\n",
          o->prog, a->model_name, o->pb_read ? ".npy or ONNX .pb" : ".npy",
          o->pb_read ? "DIR/input_K.pb or DIR/input_K.npy" : "DIR/input_K.npy");
  if (!o->pb_read)
    fprintf(f, "ONNX .pb inputs are not read by this program:\n  %s\n", PB_HINT);
  fprintf(f, "inputs:\n");
  for (int i = 0; i < a->ninputs; i++)
    fprintf(f, "  %d %s: %s\n", i, a->inputs[i].name,
            shape_text(a->inputs[i].dtype, a->inputs[i].rank, a->inputs[i].dims, s, sizeof s));
  fprintf(f, "outputs:\n");
  for (int i = 0; i < a->noutputs; i++)
    fprintf(f, "  %d %s: %s\n", i, a->outputs[i].name,
            shape_text(a->outputs[i].dtype, a->outputs[i].rank, a->outputs[i].dims, s, sizeof s));
}

static int parse_args(exe_opts *o, int argc, char **argv) {
  static const struct option longopts[] = {
      {"input", required_argument, NULL, OPT_INPUT},
      {"inputs-dir", required_argument, NULL, OPT_INPUTS_DIR},
      {"output-dir", required_argument, NULL, OPT_OUTPUT_DIR},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"seed", required_argument, NULL, OPT_SEED},
      {"profile", required_argument, NULL, OPT_PROFILE},
      {"no-graph", no_argument, NULL, OPT_NO_GRAPH},
      {"help", no_argument, NULL, 'h'},
      {0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': usage(stdout, o); exit(0);
    case OPT_INPUT: {
      char *eq = strchr(optarg, '=');
      if (!eq || eq == optarg || !eq[1] || o->nfiles == MAX_FILES) {
        fprintf(stderr, "%s: --input takes NAME=FILE, got '%s'\n", o->prog, optarg);
        return -1;
      }
      *eq = 0;
      o->names[o->nfiles] = optarg;
      o->paths[o->nfiles++] = eq + 1;
      break;
    }
    case OPT_INPUTS_DIR: o->inputs_dir = optarg; break;
    case OPT_OUTPUT_DIR: o->output_dir = optarg; break;
    case OPT_DEVICE:
      if (krt_device_kind_parse(optarg, &o->device)) {
        fprintf(stderr, "%s: --device takes auto, host or cuda, got '%s'\n", o->prog, optarg);
        return -1;
      }
      break;
    case OPT_ITERS: {
      char *end;
      errno = 0;
      o->iters = strtol(optarg, &end, 10);
      if (errno || *end || end == optarg || o->iters < 1 || o->iters > 1000000) {
        fprintf(stderr, "%s: --iters takes a count from 1 to 1000000, got '%s'\n", o->prog, optarg);
        return -1;
      }
      break;
    }
    case OPT_PROFILE: o->profile = optarg; break;
    case OPT_NO_GRAPH: o->no_graph = 1; break;
    case OPT_SEED: {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(optarg, &end, 10);
      if (errno || *end || end == optarg || optarg[0] == '-') {
        fprintf(stderr, "%s: --seed takes a non-negative integer, got '%s'\n", o->prog, optarg);
        return -1;
      }
      o->seed = v;
      break;
    }
    default: usage(stderr, o); return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", o->prog, argv[optind]);
    return -1;
  }
  for (int f = 0; f < o->nfiles; f++) {
    int i = 0;
    while (i < o->api->ninputs && strcmp(o->api->inputs[i].name, o->names[f])) i++;
    if (i == o->api->ninputs) {
      fprintf(stderr, "%s: --input %s: the model has no input named '%s' (see --help)\n", o->prog,
              o->names[f], o->names[f]);
      return -1;
    }
  }
  return 0;
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), k = strlen(tail);
  return n >= k && !strcmp(s + n - k, tail);
}

/* The file for input i: --input NAME=FILE, else DIR/input_K.pb or .npy,
 * the one this program reads first (the other, when only it is there, so
 * that a missing .pb reader is said rather than a missing file). */
static const char *input_path(const exe_opts *o, int i, char *buf, size_t n) {
  for (int f = 0; f < o->nfiles; f++)
    if (!strcmp(o->names[f], o->api->inputs[i].name)) return o->paths[f];
  if (!o->inputs_dir) return NULL;
  const char *first = o->pb_read ? "pb" : "npy", *second = o->pb_read ? "npy" : "pb";
  snprintf(buf, n, "%s/input_%d.%s", o->inputs_dir, i, first);
  if (access(buf, F_OK) != 0) {
    snprintf(buf, n, "%s/input_%d.%s", o->inputs_dir, i, second);
    if (access(buf, F_OK) != 0) snprintf(buf, n, "%s/input_%d.%s", o->inputs_dir, i, first);
  }
  return buf;
}

/* Read input i and check it against the signature; 0 or -1 (printed). */
static int read_input(const exe_opts *o, int i, krt_tensor *t) {
  const krt_io_desc *d = &o->api->inputs[i];
  char buf[4096], msg[1024], want[200], have[200];
  const char *path = input_path(o, i, buf, sizeof buf);
  if (!path) { /* like kiln run (and trtexec): seeded random values, said on stderr */
    fprintf(stderr, "%s: input '%s' not given: using seeded random values (%s, seed %llu)\n", o->prog,
            d->name, shape_text(d->dtype, d->rank, d->dims, want, sizeof want),
            (unsigned long long)(o->seed + (uint64_t)i));
    if (krt_tensor_random(d->dtype, d->rank, d->dims, o->seed + (uint64_t)i, t)) {
      fprintf(stderr, "%s: error: input '%s': out of memory\n", o->prog, d->name);
      return -1;
    }
    return 0;
  }
  if (ends_with(path, ".pb") && !o->pb_read) {
    fprintf(stderr, "%s: error: input '%s': %s: this program reads .npy inputs only; %s\n",
            o->prog, d->name, path, PB_HINT);
    return -1;
  }
  int rc = ends_with(path, ".pb") ? o->pb_read(path, t, msg, sizeof msg)
                                  : krt_npy_read(path, t, msg, sizeof msg);
  if (rc) {
    fprintf(stderr, "%s: error: input '%s': %s\n", o->prog, d->name, msg);
    return -1;
  }
  /* NumPy has no bfloat16: an f32 file feeds a bf16 input, rounded. */
  if (d->dtype == KRT_BF16 && t->dtype == KRT_F32) {
    int64_t n = krt_tensor_numel(t);
    uint16_t *h = (uint16_t *)t->data;
    for (int64_t k = 0; k < n; k++) h[k] = krt_f32_to_bf16(((float *)t->data)[k]);
    t->dtype = KRT_BF16;
  }
  /* nor the one-byte types of ONNX: a u8 file holds a small float's codes,
   * an i8 or u8 file a 4- or 2-bit integer's values (npy.c) */
  if (krt_dtype_is_small_float(d->dtype) && t->dtype == KRT_U8) t->dtype = d->dtype;
  int bits = krt_dtype_bits(d->dtype);
  if (bits < 8 && !krt_dtype_is_small_float(d->dtype) && (t->dtype == KRT_U8 || t->dtype == KRT_I8)) {
    int64_t n = krt_tensor_numel(t);
    int is_signed = d->dtype == KRT_I4 || d->dtype == KRT_I2;
    int lo = is_signed ? -(1 << (bits - 1)) : 0, hi = is_signed ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
    for (int64_t k = 0; k < n; k++) {
      int v = t->dtype == KRT_I8 ? ((int8_t *)t->data)[k] : ((uint8_t *)t->data)[k];
      if (v < lo || v > hi) {
        fprintf(stderr, "%s: error: %s: input '%s' is %s, but the file holds %d, out of its range\n",
                o->prog, path, d->name, krt_dtype_name(d->dtype), v);
        krt_tensor_free(t);
        return -1;
      }
    }
    t->dtype = d->dtype;
  }
  bool same = t->dtype == d->dtype && t->rank == d->rank;
  for (int k = 0; same && k < d->rank; k++) same = t->dims[k] == d->dims[k];
  if (!same) {
    fprintf(stderr, "%s: error: %s: input '%s' must be %s, the file holds %s\n", o->prog, path,
            d->name, shape_text(d->dtype, d->rank, d->dims, want, sizeof want),
            shape_text(t->dtype, t->rank, t->dims, have, sizeof have));
    krt_tensor_free(t);
    return -1;
  }
  return 0;
}

/* Make the output folder (one level) and check that files can be made in
 * it, before any work is done. */
static int prepare_output_dir(const exe_opts *o) {
  struct stat st;
  if (mkdir(o->output_dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: error: --output-dir %s: %s\n", o->prog, o->output_dir, strerror(errno));
    return -1;
  }
  if (stat(o->output_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s: error: --output-dir %s: not a directory\n", o->prog, o->output_dir);
    return -1;
  }
  if (access(o->output_dir, W_OK | X_OK) != 0) {
    fprintf(stderr, "%s: error: --output-dir %s: %s\n", o->prog, o->output_dir, strerror(errno));
    return -1;
  }
  return 0;
}

static double element(const krt_tensor *t, int64_t i) {
  const unsigned char *p = (const unsigned char *)t->data + (size_t)i * krt_dtype_size(t->dtype);
  switch (t->dtype) {
  case KRT_F32: { float v; memcpy(&v, p, 4); return v; }
  case KRT_F16: { uint16_t v; memcpy(&v, p, 2); return krt_f16_to_f32(v); }
  case KRT_BF16: { uint16_t v; memcpy(&v, p, 2); return krt_bf16_to_f32(v); }
  case KRT_F64: { double v; memcpy(&v, p, 8); return v; }
  case KRT_I8: return (int8_t)*p;
  case KRT_U8: case KRT_BOOL: return *p;
  case KRT_I16: { int16_t v; memcpy(&v, p, 2); return v; }
  case KRT_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
  case KRT_I32: { int32_t v; memcpy(&v, p, 4); return v; }
  case KRT_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
  case KRT_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
  case KRT_U64: { uint64_t v; memcpy(&v, p, 8); return (double)v; }
  case KRT_I4: case KRT_I2: return (int8_t)*p;
  case KRT_U4: case KRT_U2: return *p;
  case KRT_F8E4M3FN: case KRT_F8E4M3FNUZ: case KRT_F8E5M2: case KRT_F8E5M2FNUZ:
  case KRT_F4E2M1: case KRT_F8E8M0: return krt_small_float_to_f32(t->dtype, *p);
  default: return NAN;
  }
}

static void summarise(const char *name, const krt_tensor *t) {
  char s[200];
  int64_t n = krt_tensor_numel(t), nans = 0;
  double lo = INFINITY, hi = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = element(t, i);
    if (isnan(v)) { nans++; continue; }
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    sum += v;
  }
  printf("%s: %s", name, shape_text(t->dtype, t->rank, t->dims, s, sizeof s));
  if (n > nans) printf("  min %.6g  max %.6g  mean %.6g", lo, hi, sum / (double)(n - nans));
  if (nans) printf("  NaN x%lld", (long long)nans);
  printf("\n");
}

int krt_exe_main(const krt_model_api *api, int argc, char **argv) {
  return krt_exe_main_with(api, NULL, argc, argv);
}

int krt_exe_main_with(const krt_model_api *api, krt_tensor_reader pb_read, int argc, char **argv) {
  if (api->train) return krt_train_main(api, argc, argv);
  const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
  exe_opts o = {.prog = argc > 0 ? (slash ? slash + 1 : argv[0]) : api->model_name,
                .api = api, .pb_read = pb_read, .device = KRT_DEVICE_AUTO, .iters = 1};
  if (parse_args(&o, argc, argv)) return EXIT_USAGE;
  int ni = api->ninputs, no = api->noutputs, rc = 1;
  krt_tensor *in = calloc((size_t)ni + 1, sizeof *in), *out = calloc((size_t)no + 1, sizeof *out);
  const void **in_data = calloc((size_t)ni + 1, sizeof *in_data);
  void **out_data = calloc((size_t)no + 1, sizeof *out_data);
  double *times = calloc((size_t)o.iters, sizeof *times);
  krt_device *dev = NULL;
  void *model = NULL;
  krt_trace *trace = NULL;
  double *step_ms = NULL;
  char msg[1024];
  if (!in || !out || !in_data || !out_data || !times) {
    fprintf(stderr, "%s: error: out of memory\n", o.prog);
    goto done;
  }
  for (int i = 0; i < ni; i++) {
    if (read_input(&o, i, &in[i])) goto done;
    in_data[i] = in[i].data;
  }
  if (o.output_dir && prepare_output_dir(&o)) goto done;
  for (int i = 0; i < no; i++) {
    const krt_io_desc *d = &api->outputs[i];
    out[i].dtype = d->dtype;
    out[i].rank = d->rank;
    memcpy(out[i].dims, d->dims, sizeof d->dims);
    size_t bytes = (size_t)krt_tensor_numel(&out[i]) * krt_dtype_size(d->dtype);
    if (!(out[i].data = malloc(bytes ? bytes : 1))) {
      fprintf(stderr, "%s: error: out of memory for output '%s' (%zu bytes)\n", o.prog, d->name,
              bytes);
      goto done;
    }
    out_data[i] = out[i].data;
  }
  if (krt_device_open(o.device, &dev, msg, sizeof msg) ||
      (o.no_graph && (krt_device_set_graphs(dev, 0), 0)) ||
      api->create(dev, &model, msg, sizeof msg)) {
    fprintf(stderr, "%s: error: %s\n", o.prog, msg);
    goto done;
  }
  if (o.profile && (krt_profile_enable(dev, api->nsteps + 1, msg, sizeof msg) ||
                    !(trace = krt_trace_new(api, dev)) ||
                    !(step_ms = calloc((size_t)api->nsteps + 1, sizeof *step_ms)))) {
    fprintf(stderr, "%s: error: --profile: %s\n", o.prog, trace && step_ms ? msg : "out of memory");
    goto done;
  }
  /* One untimed warm-up run when timing several: the first run pays for
   * loading kernels and first touches of memory. */
  for (long it = o.iters > 1 ? -1 : 0; it < o.iters; it++) {
    double t0 = krt_now_ms();
    if (api->run(model, in_data, out_data, msg, sizeof msg)) {
      fprintf(stderr, "%s: error: %s\n", o.prog, msg);
      goto done;
    }
    if (it >= 0) times[it] = krt_now_ms() - t0;
    if (trace && it >= 0 && (krt_profile_read(dev, step_ms, api->nsteps, msg, sizeof msg) ||
                             krt_trace_add_run(trace, step_ms, times[it]))) {
      fprintf(stderr, "%s: error: --profile: %s\n", o.prog, msg);
      goto done;
    }
  }
  if (trace) {
    if (krt_trace_write(trace, o.profile, msg, sizeof msg)) {
      fprintf(stderr, "%s: error: %s\n", o.prog, msg);
      goto done;
    }
    krt_trace_summary(trace, stderr);
    fprintf(stderr, "%s: wrote the trace %s\n", o.prog, o.profile);
  }
  double median = krt_median(times, (size_t)o.iters);
  printf("device: %s\n", krt_device_name(dev));
  if (krt_device_kind_of(dev) == KRT_DEVICE_CUDA) {
    long captures, replays;
    krt_device_graph_counts(dev, &captures, &replays);
    printf("launches: %s\n", replays ? "the run captured once as a CUDA graph and replayed"
                                      : "kernel by kernel (no CUDA graph)");
  }
  printf("median: %.3f ms per run (%ld run%s)\n", median, o.iters, o.iters == 1 ? "" : "s");
  for (int i = 0; i < no; i++) {
    if (!o.output_dir) {
      summarise(api->outputs[i].name, &out[i]);
      continue;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/output_%d.npy", o.output_dir, i);
    if (krt_npy_write(path, &out[i], msg, sizeof msg)) {
      fprintf(stderr, "%s: error: output '%s': %s\n", o.prog, api->outputs[i].name, msg);
      goto done;
    }
  }
  rc = 0;
done:
  krt_trace_free(trace);
  free(step_ms);
  if (model) api->destroy(model);
  krt_device_close(dev);
  for (int i = 0; in && i < ni; i++) krt_tensor_free(&in[i]);
  for (int i = 0; out && i < no; i++) krt_tensor_free(&out[i]);
  free(in);
  free(out);
  free(in_data);
  free(out_data);
  free(times);
  return rc;
}
