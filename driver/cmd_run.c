/* cmd_run.c - `kiln run`: evaluate a model on given or generated inputs. */
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
    "  --device=interp       where to run (interp: the reference interpreter)\n"
    "  --seed N              seed for inputs that are not given (default 0)\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "Inputs that are not given are filled with seeded random values.\n";

enum { OPT_INPUT = 2000, OPT_INPUTS_DIR, OPT_OUTPUT_DIR, OPT_DEVICE, OPT_SEED };

typedef struct {
  const char *name, *path;
} named_file;

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

static int gather_inputs(const kl_graph *g, named_file *files, int nfiles,
                         const char *dir, uint64_t seed, kl_tensor **in) {
  for (int f = 0; f < nfiles; f++) {
    bool found = false;
    for (int i = 0; i < g->inputs.len; i++)
      found |= strcmp(g->inputs.items[i]->name, files[f].name) == 0;
    if (!found) {
      fprintf(stderr, "kiln: error: --input %s: the model has no input named '%s'\n",
              files[f].name, files[f].name);
      return -1;
    }
  }
  for (int i = 0; i < g->inputs.len; i++) {
    const kl_value *decl = g->inputs.items[i];
    const char *path = NULL;
    char buf[4096];
    for (int f = 0; f < nfiles; f++)
      if (strcmp(files[f].name, decl->name) == 0) path = files[f].path;
    if (!path && dir) { /* input_K.npy, or an ONNX test's input_K.pb */
      snprintf(buf, sizeof buf, "%s/input_%d.npy", dir, i);
      if (access(buf, F_OK) != 0) {
        snprintf(buf, sizeof buf, "%s/input_%d.pb", dir, i);
        if (access(buf, F_OK) != 0) snprintf(buf, sizeof buf, "%s/input_%d.npy", dir, i);
      }
      path = buf;
    }
    if (!path) {
      char s[128];
      fprintf(stderr, "kiln: input '%s' not given: using seeded random values (%s%s, seed %llu)\n",
              decl->name, kl_dtype_name(decl->dtype), kl_shape_str(&decl->shape, s, sizeof s),
              (unsigned long long)(seed + (uint64_t)i));
      in[i] = kiln_random_tensor(decl, seed + (uint64_t)i);
      continue;
    }
    if (!(in[i] = kiln_read_tensor(path))) return -1;
    /* NumPy has no bfloat16: an f32 file feeds a bf16 input. */
    if (decl->dtype == KL_BF16 && in[i]->dtype == KL_F32) {
      in[i]->dtype = KL_BF16;
      for (int64_t k = 0; k < in[i]->numel; k++)
        in[i]->data[k] = kl_dtype_round(KL_BF16, in[i]->data[k]);
    }
    if (in[i]->dtype != decl->dtype || !kl_shape_equal(&in[i]->shape, &decl->shape)) {
      char a[128], b[128];
      fprintf(stderr, "kiln: error: %s: input '%s' must be %s%s, the file holds %s%s\n", path,
              decl->name, kl_dtype_name(decl->dtype), kl_shape_str(&decl->shape, a, sizeof a),
              kl_dtype_name(in[i]->dtype), kl_shape_str(&in[i]->shape, b, sizeof b));
      return -1;
    }
  }
  return 0;
}

int kiln_cmd_run(int argc, char **argv) {
  static const struct option longopts[] = {
      {"input", required_argument, NULL, OPT_INPUT},
      {"inputs-dir", required_argument, NULL, OPT_INPUTS_DIR},
      {"output-dir", required_argument, NULL, OPT_OUTPUT_DIR},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"seed", required_argument, NULL, OPT_SEED},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  named_file files[256];
  int nfiles = 0;
  const char *inputs_dir = NULL, *output_dir = NULL;
  uint64_t seed = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(run_help, stdout); return KILN_EXIT_OK;
    case OPT_INPUT: {
      char *eq = strchr(optarg, '=');
      if (!eq || eq == optarg || !eq[1]) {
        fprintf(stderr, "kiln run: --input takes NAME=FILE, got '%s'\n", optarg);
        return KILN_EXIT_USAGE;
      }
      if (nfiles == 256) {
        fprintf(stderr, "kiln run: too many --input options\n");
        return KILN_EXIT_USAGE;
      }
      *eq = 0;
      files[nfiles++] = (named_file){optarg, eq + 1};
      break;
    }
    case OPT_INPUTS_DIR: inputs_dir = optarg; break;
    case OPT_OUTPUT_DIR: output_dir = optarg; break;
    case OPT_DEVICE:
      if (strcmp(optarg, "interp") != 0) {
        fprintf(stderr, "kiln run: --device=%s: only 'interp' exists so far\n", optarg);
        return KILN_EXIT_USAGE;
      }
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
    case OPT_DIM:
    case OPT_WEIGHTS:
    case OPT_SHAPE:
      if (kiln_model_opt(&mo, c, optarg)) return KILN_EXIT_USAGE;
      break;
    default: fputs(run_help, stderr); return KILN_EXIT_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln run: expected one MODEL file\n%s", run_help);
    return KILN_EXIT_USAGE;
  }
  kl_graph *g = kiln_load_model(argv[optind], &mo);
  if (!g) {
      return KILN_EXIT_ERROR;
  }
  int rc = KILN_EXIT_ERROR;
  kl_tensor **in = calloc((size_t)g->inputs.len + 1, sizeof *in);
  kl_tensor **out = calloc((size_t)g->outputs.len + 1, sizeof *out);
  if (!in || !out) abort();
  if (output_dir && make_dir(output_dir)) goto done;
  if (gather_inputs(g, files, nfiles, inputs_dir, seed, in)) goto done;
  kl_error err;
  if (kl_interpret(g, in, out, &err)) {
    kl_error_print(stderr, &err);
    goto done;
  }
  rc = KILN_EXIT_OK;
  for (int i = 0; i < g->outputs.len; i++) {
    char label[300], path[4096];
    snprintf(label, sizeof label, "output %d '%s'", i, g->outputs.items[i]->name);
    kiln_print_summary(stdout, label, out[i]);
    if (output_dir) {
      snprintf(path, sizeof path, "%s/output_%d.npy", output_dir, i);
      if (kiln_write_tensor(path, out[i])) rc = KILN_EXIT_ERROR;
    }
  }
  printf("device: interp\n");
done:
  for (int i = 0; i < g->inputs.len; i++) kl_tensor_free(in[i]);
  for (int i = 0; i < g->outputs.len; i++) kl_tensor_free(out[i]);
  free(in);
  free(out);
  kl_graph_free(g);
  return rc;
}
