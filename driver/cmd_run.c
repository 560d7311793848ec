/* cmd_run.c - `kiln run`: evaluate a model on given or generated inputs. */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"

static const char run_help[] =
    "usage: kiln run MODEL [options]\n"
    "Evaluate MODEL (.kl or .onnx) and print a summary of each output.\n"
    "  --input NAME=FILE     feed input NAME from a .npy or .pb file (repeatable)\n"
    "  --inputs-dir DIR      read input_0.npy (or .pb), input_1... in input order\n"
    "  --output-dir DIR      write output_0.npy, output_1.npy, ... in output order\n"
    "  --device=DEVICE       auto (the default: the compiled model on a GPU when one\n"
    "                        works, else on the host; KILN_DEVICE=host|cuda|auto\n"
    "                        overrides it), host (compiled kernels on the CPU through\n"
    "                        the CUDA emulation), cuda (a GPU), or interp (the\n"
    "                        reference interpreter, asked for by name)\n"
    "  --seed N              seed for inputs that are not given (default 0)\n"
    "  --mem-limit=SIZE      host, cuda: fail when the planned arena exceeds SIZE\n"
    "                        bytes (K, M, G: KiB, MiB, GiB)\n"
    "  --no-fuse             host, cuda: one kernel per node\n"
    "  --no-graph            cuda: launch kernel by kernel, not the run captured\n"
    "                        as a CUDA graph (also KILN_NO_GRAPH=1)\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "Inputs that are not given are filled with seeded random values.\n";

enum { OPT_INPUT = 2000, OPT_INPUTS_DIR, OPT_OUTPUT_DIR, OPT_DEVICE, OPT_SEED, OPT_MEM_LIMIT, OPT_NO_FUSE, OPT_NO_GRAPH };

typedef kiln_named_file named_file;

static int make_dir(const char *dir) {
  if (mkdir(dir, 0777) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    fprintf(stderr, "kiln: error: --output-dir %s: not a directory\n", dir);
    return -1;
  }
  fprintf(stderr, "kiln: error: --output-dir %s: %s\n", dir, strerror(errno));
  return -1;
}

/* The file that feeds input `name` (position `index`): --input NAME=FILE,
 * else DIR/input_K.npy or an ONNX test's DIR/input_K.pb; NULL if none. */
static const char *input_path(const named_file *files, int nfiles, const char *dir,
                              const char *name, int index, char *buf, size_t n) {
  for (int f = 0; f < nfiles; f++)
    if (strcmp(files[f].name, name) == 0) return files[f].path;
  if (!dir) return NULL;
  snprintf(buf, n, "%s/input_%d.pb", dir, index);
  if (access(buf, F_OK) != 0) snprintf(buf, n, "%s/input_%d.npy", dir, index);
  return buf;
}

/* Every --input must name an input of the model. */
static int check_input_names(const named_file *files, int nfiles, const char *const *names,
                             int n) {
  for (int f = 0; f < nfiles; f++) {
    bool found = false;
    for (int i = 0; i < n; i++) found |= strcmp(names[i], files[f].name) == 0;
    if (!found) {
      fprintf(stderr, "kiln: error: --input %s: the model has no input named '%s'\n",
              files[f].name, files[f].name);
      return -1;
    }
  }
  return 0;
}

/* A value read from `path` for input `decl`: right dtype and shape. */
static int check_value(const kl_value *decl, kl_tensor *t, const char *path) {
  /* NumPy has no bfloat16, and --io-precision turns f32 inputs into f16 or
   * bf16: an f32 file feeds a bf16 or f16 input. */
  if ((decl->dtype == KL_BF16 || decl->dtype == KL_F16) && t->dtype == KL_F32) {
    t->dtype = decl->dtype;
    for (int64_t k = 0; k < t->numel; k++) t->data[k] = kl_dtype_round(t->dtype, t->data[k]);
  }
  /* nor the one-byte types of ONNX: a u8 file holds a small float's codes,
   * an i8 or u8 file a 4- or 2-bit integer's values (runtime/npy.c) */
  if (kl_dtype_is_small_float(decl->dtype) && t->dtype == KL_U8) {
    t->dtype = decl->dtype;
    for (int64_t k = 0; k < t->numel; k++)
      t->data[k] = krt_small_float_to_f32((krt_dtype)t->dtype, (uint8_t)t->data[k]);
  }
  if (kl_dtype_bits(decl->dtype) < 8 && kl_dtype_is_int(decl->dtype) &&
      (t->dtype == KL_U8 || t->dtype == KL_I8)) {
    for (int64_t k = 0; k < t->numel; k++)
      if (kl_dtype_round(decl->dtype, t->data[k]) != t->data[k]) {
        fprintf(stderr, "kiln: error: %s: input '%s' is %s, but the file holds %g, out of its "
                "range\n", path, decl->name, kl_dtype_name(decl->dtype), t->data[k]);
        return -1;
      }
    t->dtype = decl->dtype;
  }
  if (t->dtype != decl->dtype || !kl_shape_equal(&t->shape, &decl->shape)) {
    char a[128], b[128];
    fprintf(stderr, "kiln: error: %s: input '%s' must be %s%s, the file holds %s%s\n", path,
            kl_value_label(decl), kl_dtype_name(decl->dtype), kl_shape_str(&decl->shape, a, sizeof a),
            kl_dtype_name(t->dtype), kl_shape_str(&t->shape, b, sizeof b));
    return -1;
  }
  return 0;
}

static kl_tensor *random_input(const kl_value *decl, uint64_t seed) {
  char s[128];
  fprintf(stderr, "kiln: input '%s' not given: using seeded random values (%s%s, seed %llu)\n",
          kl_value_label(decl), kl_dtype_name(decl->dtype), kl_shape_str(&decl->shape, s, sizeof s),
          (unsigned long long)seed);
  return kiln_random_tensor(decl, seed);
}

static int gather_inputs(const kl_graph *g, const named_file *files, int nfiles,
                         const char *dir, uint64_t seed, kl_tensor **in) {
  const char **names = calloc((size_t)g->inputs.len + 1, sizeof *names);
  if (!names) abort();
  for (int i = 0; i < g->inputs.len; i++) names[i] = kl_value_label(g->inputs.items[i]);
  int rc = check_input_names(files, nfiles, names, g->inputs.len);
  free(names);
  for (int i = 0; i < g->inputs.len && !rc; i++) {
    const kl_value *decl = g->inputs.items[i];
    char buf[4096];
    const char *path = input_path(files, nfiles, dir, kl_value_label(decl), i, buf, sizeof buf);
    double scalar;
    if (!path && kiln_train_scalar(g, decl, &scalar)) {
      in[i] = kl_tensor_new(decl->dtype, &decl->shape);
      in[i]->data[0] = scalar;
    } else if (!path) in[i] = random_input(decl, seed + (uint64_t)i);
    else if (!(in[i] = kiln_read_tensor(path)) || check_value(decl, in[i], path)) rc = -1;
  }
  return rc;
}

/* An ONNX model is compiled for the inputs at hand: symbolic dims take the
 * given files' shapes, and an input that decides a shape (a Reshape target,
 * Slice bounds) is frozen to the given value.  Fills `in` for the inputs
 * that remain (when in_out is not NULL). */
static kl_graph *load_onnx_for_run(const char *path, const kiln_model_opts *mo,
                                   const named_file *files, int nfiles, const char *dir,
                                   uint64_t seed, kl_tensor ***in_out) {
  enum { MAX_IN = 64 };
  static char names[MAX_IN][256];
  const char *name_ptrs[MAX_IN];
  kl_tensor *values[MAX_IN] = {0};
  bool frozen[MAX_IN] = {0};
  kl_error err;
  kl_graph *g = NULL;
  int n = kl_onnx_input_names(path, names, MAX_IN, &err);
  if (n < 0) {
    kiln_print_onnx_error(path, &err);
    return NULL;
  }
  for (int k = 0; k < n; k++) name_ptrs[k] = names[k];
  bool ok = check_input_names(files, nfiles, name_ptrs, n) == 0;
  for (int k = 0; k < n && ok; k++) {
    char buf[4096];
    const char *p = input_path(files, nfiles, dir, names[k], k, buf, sizeof buf);
    if (p && !(values[k] = kiln_read_tensor(p))) ok = false;
  }
  if (ok) {
    kl_onnx_options opt = {0};
    g = kl_onnx_load_for_inputs(path, name_ptrs, values, n, frozen, &opt, &err);
    if (!g) kiln_print_onnx_error(path, &err);
  }
  if (g && ((mo->weights && kiln_apply_weights(g, mo->weights)) || kiln_apply_precision(g, mo))) {
    kl_graph_free(g);
    g = NULL;
  }
  kl_tensor **in = g && in_out ? calloc((size_t)g->inputs.len + 1, sizeof *in) : NULL;
  for (int k = 0, i = 0; in && k < n; k++) {
    if (frozen[k]) {
      fprintf(stderr, "kiln: input '%s' decides a shape: compiled with the given value\n",
              names[k]);
      continue;
    }
    if (i >= g->inputs.len) break;
    const kl_value *decl = g->inputs.items[i];
    if (!values[k]) {
      in[i] = random_input(decl, seed + (uint64_t)i);
    } else {
      in[i] = values[k];
      values[k] = NULL;
      if (check_value(decl, in[i], names[k])) {
        for (int j = 0; j <= i; j++) kl_tensor_free(in[j]);
        free(in);
        in = NULL;
        kl_graph_free(g);
        g = NULL;
      }
    }
    i++;
  }
  for (int k = 0; k < n; k++) kl_tensor_free(values[k]);
  if (in_out) *in_out = in;
  return g;
}

kl_graph *kiln_load_for_run(const char *path, const kiln_model_opts *mo, const kiln_input_opts *io,
                            kl_tensor ***in) {
  /* with --shape or --dim the user binds the shapes, else the inputs do */
  bool onnx = kiln_is_onnx(path) && mo->nshapes == 0 && mo->ndims == 0;
  if (onnx) return load_onnx_for_run(path, mo, io->files, io->nfiles, io->dir, io->seed, in);
  kl_graph *g = kiln_load_model(path, mo);
  if (!g || !in) return g;
  *in = calloc((size_t)g->inputs.len + 1, sizeof **in);
  if (!*in) abort();
  if (!gather_inputs(g, io->files, io->nfiles, io->dir, io->seed, *in)) return g;
  for (int i = 0; i < g->inputs.len; i++) kl_tensor_free((*in)[i]);
  free(*in);
  *in = NULL;
  kl_graph_free(g);
  return NULL;
}

int kiln_input_file_opt(const char *cmd, char *arg, kiln_named_file *files, int *nfiles,
                        int cap) {
  char *eq = strchr(arg, '=');
  if (!eq || eq == arg || !eq[1]) {
    fprintf(stderr, "kiln %s: --input takes NAME=FILE, got '%s'\n", cmd, arg);
    return -1;
  }
  if (*nfiles == cap) {
    fprintf(stderr, "kiln %s: too many --input options\n", cmd);
    return -1;
  }
  *eq = 0;
  files[(*nfiles)++] = (named_file){arg, eq + 1};
  return 0;
}

int kiln_run_compiled(const kl_graph *g, krt_device_kind kind, const kiln_compile_opts *base,
                      kl_tensor **in, kl_tensor **out, char *device_name, size_t n) {
  kl_codegen_result cg;
  char dir[4096], msg[1024];
  krt_device *dev = NULL;
  /* the device first: its architecture picks the cut-offs, and auto
   * decides whether GPU images are needed */
  if (krt_device_open(kind, &dev, msg, sizeof msg)) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    return -1;
  }
  kiln_cutoff_sm = krt_device_sm(dev);
  if (kiln_generate(g, base, &cg)) {
    krt_device_close(dev);
    return -1;
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int rc = -1;
  const krt_model_api *api = NULL;
  void *handle = NULL, *model = NULL;
  void **raw_in = calloc((size_t)g->inputs.len + 1, sizeof *raw_in);
  void **raw_out = calloc((size_t)g->outputs.len + 1, sizeof *raw_out);
  if (!raw_in || !raw_out) abort();
  bool made = mkdtemp(dir) != NULL; /* (a random suffix may hold an X too) */
  if (!made) {
    fprintf(stderr, "kiln: error: cannot make a build folder under %s: %s\n",
            tmp && *tmp ? tmp : "/tmp", strerror(errno));
    goto done;
  }
  if (!(handle = kiln_build_host(&cg, dir, krt_device_sm(dev), &api)))
    goto done;
  if (api->create(dev, &model, msg, sizeof msg)) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    goto done;
  }
  for (int i = 0; i < g->inputs.len; i++) {
    raw_in[i] = malloc((size_t)in[i]->numel * kl_dtype_size(in[i]->dtype) + 1);
    if (!raw_in[i]) abort();
    kl_tensor_to_raw(in[i], raw_in[i]);
  }
  for (int i = 0; i < g->outputs.len; i++) {
    out[i] = kl_tensor_new(g->outputs.items[i]->dtype, &g->outputs.items[i]->shape);
    raw_out[i] = malloc((size_t)out[i]->numel * kl_dtype_size(out[i]->dtype) + 1);
    if (!raw_out[i]) abort();
  }
  /* the API's outputs are the graph's but a training step's update
   * values, which are read back from the state they overwrote */
  void **api_out = calloc((size_t)g->outputs.len + 1, sizeof *api_out);
  if (!api_out) abort();
  for (int i = 0, k = 0; i < g->outputs.len; i++)
    if (!g->outputs.items[i]->updates) api_out[k++] = raw_out[i];
  int run_rc = api->run(model, (const void *const *)raw_in, api_out, msg, sizeof msg);
  free(api_out);
  for (int i = 0; !run_rc && i < g->outputs.len; i++) {
    const kl_value *v = g->outputs.items[i];
    for (int s = 0; v->updates && api->train && s < api->train->nstates; s++)
      if (!strcmp(api->train->states[s].name, kl_value_label(v->updates)))
        run_rc = api->read_state(model, s, raw_out[i], msg, sizeof msg);
  }
  if (run_rc) {
    fprintf(stderr, "kiln: error: %s\n", msg);
    goto done;
  }
  for (int i = 0; i < g->outputs.len; i++) kl_tensor_from_raw(out[i], raw_out[i]);
  snprintf(device_name, n, "%s", krt_device_name(dev));
  rc = 0;
done:
  if (model) api->destroy(model);
  krt_device_close(dev);
  if (handle) dlclose(handle);
  for (int i = 0; i < g->inputs.len; i++) free(raw_in[i]);
  for (int i = 0; i < g->outputs.len; i++) free(raw_out[i]);
  free(raw_in);
  free(raw_out);
  kl_codegen_result_free(&cg);
  if (made) kiln_remove_build_dir(dir);
  return rc;
}

int kiln_cmd_run(int argc, char **argv) {
  static const struct option longopts[] = {
      {"input", required_argument, NULL, OPT_INPUT},
      {"inputs-dir", required_argument, NULL, OPT_INPUTS_DIR},
      {"output-dir", required_argument, NULL, OPT_OUTPUT_DIR},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"seed", required_argument, NULL, OPT_SEED},
      {"mem-limit", required_argument, NULL, OPT_MEM_LIMIT},
      {"no-fuse", no_argument, NULL, OPT_NO_FUSE},
      {"no-graph", no_argument, NULL, OPT_NO_GRAPH},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  named_file files[256];
  int nfiles = 0;
  const char *inputs_dir = NULL, *output_dir = NULL, *device = "auto";
  uint64_t seed = 0;
  kiln_compile_opts copt = {0};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(run_help, stdout); return KILN_EXIT_OK;
    case OPT_INPUT:
      if (kiln_input_file_opt("run", optarg, files, &nfiles, 256)) return KILN_EXIT_USAGE;
      break;
    case OPT_INPUTS_DIR: inputs_dir = optarg; break;
    case OPT_OUTPUT_DIR: output_dir = optarg; break;
    case OPT_DEVICE:
      if (strcmp(optarg, "interp") && strcmp(optarg, "host") && strcmp(optarg, "cuda") &&
          strcmp(optarg, "auto")) {
        fprintf(stderr, "kiln run: --device=%s: choose interp, host, cuda or auto\n", optarg);
        return KILN_EXIT_USAGE;
      }
      device = optarg;
      break;
    case OPT_NO_FUSE: copt.no_fuse = true; break;
    case OPT_NO_GRAPH: setenv("KILN_NO_GRAPH", "1", 1); break; /* read when the device opens */
    case OPT_MEM_LIMIT:
      if (kiln_parse_mem_limit("run", optarg, &copt.mem_limit)) return KILN_EXIT_USAGE;
      break;
    case OPT_SEED: {
      char *end;
      errno = 0;
      seed = strtoull(optarg, &end, 10);
      if (*end || end == optarg || errno) {
        fprintf(stderr, "kiln run: --seed takes a non-negative integer\n");
        return KILN_EXIT_USAGE;
      }
      break;
    }
    default:
      if (kiln_model_opt_or_usage(&mo, c, optarg, run_help)) return KILN_EXIT_USAGE;
      break;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln run: expected one MODEL file\n%s", run_help);
    return KILN_EXIT_USAGE;
  }
  const char *model = argv[optind];
  if (output_dir && make_dir(output_dir)) return KILN_EXIT_ERROR;
  kl_tensor **in = NULL;
  kiln_input_opts io = {files, nfiles, inputs_dir, seed};
  mo.mem_limit = copt.mem_limit, mo.no_fuse = copt.no_fuse;
  kl_graph *g = kiln_load_for_run(model, &mo, &io, &in);
  if (!g) return KILN_EXIT_ERROR;
  int rc = KILN_EXIT_ERROR;
  kl_tensor **out = calloc((size_t)g->outputs.len + 1, sizeof *out);
  if (!out) abort();
  kl_error err;
  char device_name[128] = "interp";
  if (strcmp(device, "interp")) {
    krt_device_kind kind;
    krt_device_kind_parse(device, &kind);
    if (kiln_run_compiled(g, kind, &copt, in, out, device_name, sizeof device_name)) goto done;
  } else if (kl_interpret(g, in, out, &err)) {
    kl_error_print(stderr, &err);
    goto done;
  }
  rc = KILN_EXIT_OK;
  for (int i = 0; i < g->outputs.len; i++) {
    char label[300], path[4096];
    snprintf(label, sizeof label, "output %d '%s'", i, kl_value_label(g->outputs.items[i]));
    kiln_print_summary(stdout, label, out[i]);
    if (output_dir) {
      snprintf(path, sizeof path, "%s/output_%d.npy", output_dir, i);
      if (kiln_write_tensor(path, out[i])) rc = KILN_EXIT_ERROR;
    }
  }
  printf("device: %s\n", device_name);
done:
  for (int i = 0; i < g->inputs.len; i++) kl_tensor_free(in[i]);
  for (int i = 0; i < g->outputs.len; i++) kl_tensor_free(out[i]);
  free(in);
  free(out);
  kl_graph_free(g);
  return rc;
}
