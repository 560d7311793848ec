/* cmd_bench.c - `kiln bench`: compile a model fused and unfused through the
 * same pipeline, run both on one device, and print what fusion buys: static
 * counts (kernels, launches, estimated DRAM bytes, planned arena against
 * its lower bound) and measured times, with fused/unfused ratios.  And
 * `kiln profile`: one compile, each step timed (krt_mark), its bandwidth
 * against the device's own copy bandwidth. */
#include <errno.h>
#include <dlfcn.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char bench_help[] =
    "usage: kiln bench MODEL [options]\n"
    "Compile MODEL fused and unfused, run both, and print one table.\n"
    "  --device=DEVICE       host, cuda or auto (default; KILN_DEVICE overrides)\n"
    "  --iters N             timed runs per side after one warm-up (default 10)\n"
    "  --json                print one JSON object instead of the table\n"
    "  --no-graph            on a GPU, time kernel-by-kernel launches only (by\n"
    "                        default each side is timed replaying its run as a\n"
    "                        CUDA graph, then kernel by kernel)\n"
    "  --data DIR            with --train: also train the fused step on DIR for\n"
    "                        --iters steps (at least 50) and print the split of\n"
    "                        its time into compute and input wait\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "Inputs are seeded random values; times are medians on a possibly shared\n"
    "machine, so read the ratios, not the absolute numbers.\n";

enum { OPT_DEVICE = 2300, OPT_ITERS, OPT_JSON, OPT_NO_FUSE, OPT_DATA, OPT_NO_GRAPH };

typedef struct {
  int kernels, launches;
  size_t dram_bytes, arena_bytes, arena_lower_bound, naive_bytes;
  double compile_ms, run_ms;
  bool graphed;      /* run_ms replays a CUDA graph; plain_ms launches one by one */
  double plain_ms;
} side;

/* ---- the profile: each step's median time against the copy bandwidth -- */
typedef struct {
  bool on, json;
  double copy_gbps;  /* device to device, bytes read plus written */
} profile_opts;

static void print_profile(const char *model, const char *device, const profile_opts *po,
                          const krt_model_api *api, double *const *ms, long iters) {
  double total_ms = 0, *med = calloc((size_t)api->nsteps + 1, sizeof *med),
         *col = calloc((size_t)iters + 1, sizeof *col);
  size_t total_bytes = 0;
  int total_launches = 0;
  if (!med || !col) abort();
  for (int i = 0; i < api->nsteps; i++) {
    for (long it = 0; it < iters; it++) col[it] = ms[it][i];
    med[i] = krt_median(col, (size_t)iters);
    total_ms += med[i];
    total_bytes += api->steps[i].bytes;
    total_launches += api->steps[i].launches;
  }
#define GBPS(bytes, t) ((t) > 0 ? (double)(bytes) / ((t) * 1e6) : 0.0)
  if (po->json) {
    printf("{\"model\": \"%s\", \"device\": \"%s\", \"iters\": %ld, \"copy_gbps\": %.3f, \"steps\": [",
           model, device, iters, po->copy_gbps);
    for (int i = 0; i < api->nsteps; i++)
      printf("%s\n  {\"name\": \"%s\", \"launches\": %d, \"bytes\": %zu, \"ms\": %.5f, \"gbps\": %.3f, "
             "\"of_copy\": %.4f}", i ? "," : "", api->steps[i].name, api->steps[i].launches,
             api->steps[i].bytes, med[i], GBPS(api->steps[i].bytes, med[i]),
             po->copy_gbps > 0 ? GBPS(api->steps[i].bytes, med[i]) / po->copy_gbps : 0);
    printf("],\n \"total\": {\"launches\": %d, \"bytes\": %zu, \"ms\": %.5f}}\n", total_launches,
           total_bytes, total_ms);
  } else {
    printf("kiln profile %s  (device: %s; %ld runs, medians; device-to-device copy %.2f GB/s)\n",
           model, device, iters, po->copy_gbps);
    printf("%-46s %8s %12s %10s %9s %8s\n", "step", "launches", "est. bytes", "ms", "GB/s",
           "of copy");
    for (int i = 0; i < api->nsteps; i++) {
      double bw = GBPS(api->steps[i].bytes, med[i]);
      printf("%-46.46s %8d %12zu %10.4f %9.2f %7.1f%%\n", api->steps[i].name, api->steps[i].launches,
             api->steps[i].bytes, med[i], bw, po->copy_gbps > 0 ? 100 * bw / po->copy_gbps : 0);
    }
    printf("%-46s %8d %12zu %10.4f %9.2f\n", "total (steps summed)", total_launches, total_bytes,
           total_ms, GBPS(total_bytes, total_ms));
  }
#undef GBPS
  free(med);
  free(col);
}

/* Compile g (fused or not) for dev, run it iters times on `in`; with the
 * profile on, time each step and print the profile. */
static int measure(const kl_graph *g, bool fuse, krt_device *dev, void **in, long iters, side *s,
                   char *device_name, size_t n, const profile_opts *po) {
  kl_codegen_result cg;
  kiln_compile_opts copt = {.no_fuse = !fuse};
  kiln_cutoff_sm = krt_device_sm(dev);
  double t0 = krt_now_ms();
  if (kiln_generate(g, &copt, &cg)) return -1;
  s->kernels = cg.nkernels;
  s->launches = cg.nlaunches;
  s->dram_bytes = cg.dram_bytes;
  s->arena_bytes = cg.arena_bytes;
  s->arena_lower_bound = cg.arena_lower_bound;
  s->naive_bytes = cg.naive_bytes;
  char dir[4096], msg[1024];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  const krt_model_api *api = NULL;
  void *handle = NULL, *model = NULL, **out = NULL;
  double *times = calloc((size_t)iters, sizeof *times), **step_ms = NULL;
  int rc = -1;
  if (!times) abort();
  bool made = mkdtemp(dir) != NULL; /* (a random suffix may hold an X too) */
  if (!made) {
    fprintf(stderr, "kiln: error: cannot make a build folder: %s\n", strerror(errno));
    goto done;
  }
  handle = kiln_build_host(&cg, dir, krt_device_sm(dev), &api);
  s->compile_ms = krt_now_ms() - t0;
  if (!handle) goto done;
  if (api->create(dev, &model, msg, sizeof msg)) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    goto done;
  }
  out = calloc((size_t)g->outputs.len + 1, sizeof *out);
  if (!out) abort();
  for (int i = 0; i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    if (!(out[i] = malloc((size_t)kl_shape_numel(&v->shape) * kl_dtype_size(v->dtype) + 1))) abort();
  }
  if (po->on) {
    if (!(step_ms = calloc((size_t)iters, sizeof *step_ms))) abort();
    for (long it = 0; it < iters; it++)
      if (!(step_ms[it] = calloc((size_t)api->nsteps + 1, sizeof **step_ms))) abort();
    if (krt_profile_enable(dev, api->nsteps + 1, msg, sizeof msg)) {
      fprintf(stderr, "kiln: error: %s\n", msg);
      goto done;
    }
  }
  for (long it = -1; it < iters; it++) { /* one warm-up run */
    double r0 = krt_now_ms();
    if (api->run(model, (const void *const *)in, out, msg, sizeof msg) ||
        (po->on && it >= 0 && krt_profile_read(dev, step_ms[it], api->nsteps, msg, sizeof msg))) {
      fprintf(stderr, "kiln: error: %s\n", msg);
      goto done;
    }
    if (it >= 0) times[it] = krt_now_ms() - r0;
  }
  s->run_ms = krt_median(times, (size_t)iters);
  /* on a GPU, the same runs again kernel by kernel: what the graph saves */
  if (krt_device_graphs(dev) && !po->on) {
    krt_device_set_graphs(dev, 0);
    for (long it = -1; it < iters; it++) {
      double r0 = krt_now_ms();
      if (api->run(model, (const void *const *)in, out, msg, sizeof msg)) {
        fprintf(stderr, "kiln: error: %s\n", msg);
        krt_device_set_graphs(dev, 1);
        goto done;
      }
      if (it >= 0) times[it] = krt_now_ms() - r0;
    }
    krt_device_set_graphs(dev, 1);
    long captures = 0;
    krt_device_graph_counts(dev, &captures, NULL);
    s->graphed = captures > 0; /* (a refused capture ran plain launches) */
    s->plain_ms = krt_median(times, (size_t)iters);
  }
  snprintf(device_name, n, "%s", krt_device_name(dev));
  if (po->on) print_profile(g->name, device_name, po, api, step_ms, iters);
  rc = 0;
done:
  if (po->on) krt_profile_enable(dev, 0, NULL, 0);
  for (long it = 0; step_ms && it < iters; it++) free(step_ms[it]);
  free(step_ms);
  if (model) api->destroy(model);
  if (handle) dlclose(handle);
  for (int i = 0; out && i < g->outputs.len; i++) free(out[i]);
  free(out);
  free(times);
  kl_codegen_result_free(&cg);
  if (made) kiln_remove_build_dir(dir);
  return rc;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static void print_table(const char *model, const char *device, const char *precision,
                        const side *f, const side *u, long iters) {
  printf("kiln bench %s  (device: %s, precision: %s)\n", model, device, precision);
  printf("%-22s %16s %16s %14s\n", "", "fused", "unfused", "fused/unfused");
#define ROW(label, fmt, field)                                                              \
  printf("%-22s %16" fmt " %16" fmt " %14.3f\n", label, f->field, u->field,                 \
         ratio((double)f->field, (double)u->field))
  ROW("kernels", "d", kernels);
  ROW("launches", "d", launches);
  ROW("dram bytes (est.)", "zu", dram_bytes);
  ROW("arena bytes", "zu", arena_bytes);
  ROW("arena lower bound", "zu", arena_lower_bound);
  ROW("naive bytes", "zu", naive_bytes);
  printf("%-22s %16.1f %16.1f %14.3f\n", "compile ms", f->compile_ms, u->compile_ms,
         ratio(f->compile_ms, u->compile_ms));
  printf("%-22s %16.3f %16.3f %14.3f\n", "run ms (median)", f->run_ms, u->run_ms,
         ratio(f->run_ms, u->run_ms));
#undef ROW
  if (f->graphed && u->graphed)
    printf("%-22s %16.3f %16.3f %14.3f\n"
           "CUDA graph / plain launches: fused %.3f, unfused %.3f (run ms above: graph replays)\n",
           "run ms, no graph", f->plain_ms, u->plain_ms, ratio(f->plain_ms, u->plain_ms),
           ratio(f->run_ms, f->plain_ms), ratio(u->run_ms, u->plain_ms));
  else
    printf("CUDA graphs: none (%s); every run launches kernel by kernel\n",
           strncmp(device, "cuda", 4) ? "not on the host device" : "off, or the capture was refused");
  printf("arena / lower bound: fused %.3f, unfused %.3f; runs: %ld per side\n",
         ratio((double)f->arena_bytes, (double)f->arena_lower_bound),
         ratio((double)u->arena_bytes, (double)u->arena_lower_bound), iters);
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
    else putchar(*s);
  }
  putchar('"');
}

static void json_side(const char *key, const side *s) {
  printf("\"%s\": {\"kernels\": %d, \"launches\": %d, \"dram_bytes\": %zu, \"arena_bytes\": %zu, "
         "\"arena_lower_bound\": %zu, \"naive_bytes\": %zu, \"compile_ms\": %.3f, \"run_ms\": %.4f, "
         "\"cuda_graph\": %s",
         key, s->kernels, s->launches, s->dram_bytes, s->arena_bytes, s->arena_lower_bound,
         s->naive_bytes, s->compile_ms, s->run_ms, s->graphed ? "true" : "false");
  if (s->graphed) printf(", \"plain_run_ms\": %.4f", s->plain_ms);
  printf("}");
}

static const char profile_help[] =
    "usage: kiln profile MODEL [options]\n"
    "Compile MODEL (fused), run it, and time each step: every kernel, and each\n"
    "GEMM with its epilogue.  Each step's estimated DRAM bytes over its median\n"
    "time give its bandwidth, printed also as a fraction of the device's own\n"
    "device-to-device copy bandwidth, measured first.\n"
    "  --device=DEVICE       host, cuda or auto (default; KILN_DEVICE overrides)\n"
    "  --iters N             timed runs after one warm-up (default 10)\n"
    "  --no-fuse             profile the unfused compile instead\n"
    "  --json                print one JSON object instead of the table\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "On the host device a step's time is the clock around its launches; on a\n"
    "GPU, CUDA events between the steps.\n";

static int bench_or_profile(int argc, char **argv, bool profile);

/* kiln bench --train --data DIR: the fused step trained for real, through
 * the training program, which prints where its time went. */
static int train_split(const kl_graph *g, krt_device_kind kind, const char *data, long iters) {
  if (!g->train || !g->train->built) {
    fprintf(stderr, "kiln bench: --data needs --train\n");
    return KILN_EXIT_USAGE;
  }
  kiln_compile_opts co = {.prefix = "model"};
  kl_codegen_result cg;
  kiln_cutoffs_for_device(kind);
  if (kiln_generate(g, &co, &cg)) return KILN_EXIT_ERROR;
  char dir[4096], steps[32];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  snprintf(steps, sizeof steps, "%ld", iters < 50 ? 50 : iters);
  int rc = KILN_EXIT_ERROR;
  /* the device was probed for the cut-offs: a GPU's images only on a GPU */
  bool made = mkdtemp(dir) != NULL, gpu = kiln_cutoff_sm > 0;
  int gpu_sm = kiln_cutoff_sm;
  const krt_model_api *api;
  void *handle = made ? kiln_build_host(&cg, dir, gpu_sm, &api) : NULL;
  if (handle) {
    char *argv[] = {"kiln bench --data", "--data", (char *)data, "--steps", steps, "--device",
                    gpu ? "cuda" : "host", NULL};
    printf("training the fused step on %s (%s steps):\n", data, steps);
    fflush(stdout);
    rc = krt_train_main(api, 7, argv);
    dlclose(handle);
  }
  if (made) kiln_remove_build_dir(dir);
  kl_codegen_result_free(&cg);
  return rc;
}

int kiln_cmd_bench(int argc, char **argv) { return bench_or_profile(argc, argv, false); }
int kiln_cmd_profile(int argc, char **argv) { return bench_or_profile(argc, argv, true); }

static int bench_or_profile(int argc, char **argv, bool profile) {
  const char *help = profile ? profile_help : bench_help, *cmd = profile ? "profile" : "bench";
  bool no_fuse = false;
  static const struct option longopts[] = {
      {"device", required_argument, NULL, OPT_DEVICE},
      {"iters", required_argument, NULL, OPT_ITERS},
      {"json", no_argument, NULL, OPT_JSON},
      {"no-fuse", no_argument, NULL, OPT_NO_FUSE},
      {"data", required_argument, NULL, OPT_DATA},
      {"no-graph", no_argument, NULL, OPT_NO_GRAPH},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  krt_device_kind kind = KRT_DEVICE_AUTO;
  long iters = 10;
  bool json = false, no_graph = false;
  const char *data = NULL;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(help, stdout); return KILN_EXIT_OK;
    case OPT_DEVICE:
      if (krt_device_kind_parse(optarg, &kind)) {
        fprintf(stderr, "kiln %s: --device takes host, cuda or auto, got '%s'\n", cmd, optarg);
        return KILN_EXIT_USAGE;
      }
      break;
    case OPT_ITERS: {
      char *end;
      errno = 0;
      iters = strtol(optarg, &end, 10);
      if (errno || *end || end == optarg || iters < 1 || iters > 100000) {
        fprintf(stderr, "kiln %s: --iters takes a count from 1 to 100000, got '%s'\n", cmd,
                optarg);
        return KILN_EXIT_USAGE;
      }
      break;
    }
    case OPT_JSON: json = true; break;
    case OPT_DATA: data = optarg; break;
    case OPT_NO_GRAPH: no_graph = true; break;
    case OPT_NO_FUSE:
      if (!profile) {
        fprintf(stderr, "kiln bench: --no-fuse: bench compiles both ways already\n");
        return KILN_EXIT_USAGE;
      }
      no_fuse = true;
      break;
    default:
      if (kiln_model_opt_or_usage(&mo, c, optarg, help)) return KILN_EXIT_USAGE;
      break;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln %s: expected one MODEL file\n%s", cmd, help);
    return KILN_EXIT_USAGE;
  }
  kl_graph *g = kiln_load_model(argv[optind], &mo);
  if (!g) return KILN_EXIT_ERROR;
  int rc = KILN_EXIT_ERROR;
  char msg[1024], device[256] = "?";
  krt_device *dev = NULL;
  void **in = calloc((size_t)g->inputs.len + 1, sizeof *in);
  if (!in) abort();
  for (int i = 0; i < g->inputs.len; i++) {
    const kl_value *v = g->inputs.items[i];
    kl_tensor *t = kiln_random_tensor(v, (uint64_t)i);
    double scalar; /* a training step's scalars: a real step */
    if (kiln_train_scalar(g, v, &scalar)) t->data[0] = scalar;
    if (!(in[i] = malloc((size_t)t->numel * kl_dtype_size(t->dtype) + 1))) abort();
    kl_tensor_to_raw(t, in[i]);
    kl_tensor_free(t);
  }
  side fused = {0}, unfused = {0};
  profile_opts po = {.on = profile, .json = json}, off = {0};
  bool opened = krt_device_open(kind, &dev, msg, sizeof msg) == 0;
  if (opened && no_graph) krt_device_set_graphs(dev, 0);
  if (!opened) {
    fprintf(stderr, "kiln: error: %s\n", msg);
  } else if (profile) {
    /* a copy far larger than the caches: 256 MiB on a GPU, 64 MiB here */
    size_t bytes = (size_t)(krt_device_kind_of(dev) == KRT_DEVICE_CUDA ? 256 : 64) << 20;
    if (krt_copy_bandwidth(dev, bytes, 5, &po.copy_gbps, msg, sizeof msg))
      fprintf(stderr, "kiln: error: %s\n", msg);
    else if (!measure(g, !no_fuse, dev, in, iters, &fused, device, sizeof device, &po))
      rc = KILN_EXIT_OK;
  } else if (!measure(g, true, dev, in, iters, &fused, device, sizeof device, &off) &&
             !measure(g, false, dev, in, iters, &unfused, device, sizeof device, &off)) {
    const char *precision = !mo.precision || mo.prec.low == KL_F32 ? "fp32"
                            : mo.prec.low == KL_F16                ? "fp16"
                                                                   : "bf16";
    if (json) {
      printf("{\"model\": ");
      json_string(g->name);
      printf(", \"device\": ");
      json_string(device);
      printf(", \"precision\": ");
      json_string(precision);
      printf(", \"iters\": %ld, ", iters);
      json_side("fused", &fused);
      printf(", ");
      json_side("unfused", &unfused);
      printf("}\n");
    } else {
      print_table(g->name, device, precision, &fused, &unfused, iters);
    }
    rc = KILN_EXIT_OK;
  }
  if (rc == KILN_EXIT_OK && data && !profile) rc = train_split(g, kind, data, iters);
  krt_device_close(dev);
  for (int i = 0; i < g->inputs.len; i++) free(in[i]);
  free(in);
  kl_graph_free(g);
  return rc;
}
