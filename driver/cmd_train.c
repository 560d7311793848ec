/* cmd_train.c - `kiln train MODEL --data DIR ...`: compile the model's
 * training step (as kiln compile --train) for the host (and the GPU when
 * the device is one), load it, and run the training program on it
 * (krt_train_main, the same code a compiled --emit=exe step runs). */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "../runtime/mpi/kilnrt_mpi.h"

static const char help[] =
    "usage: kiln train MODEL --data DIR (--epochs N | --steps N) [options]\n"
    "Compile MODEL's training step (its train block: forward, backward and\n"
    "the optimizer's update, fused and planned together) and train it.\n"
    "compile options:\n"
    "  --mem-limit=SIZE      the step's arena may take at most SIZE bytes\n"
    "  --no-fuse             one kernel per node\n" KILN_MODEL_HELP
    "training options (those of a program made by kiln compile --train --emit=exe):\n"
    "  --data DIR --epochs N --steps N --batch B --checkpoint FILE\n"
    "  --checkpoint-every N --resume FILE --seed S --log-every N --losses FILE\n"
    "  --device auto|host|cuda --timeout S --inject-inf-rank R\n"
    "The last line is `final: step=N loss=X`, with ` accuracy=Y` when DIR holds\n"
    "test_x.npy and test_y.npy.\n";

/* A compile option and whether it takes a value ("--name=V" or "--name V"). */
static int compile_option(const char *arg, bool *takes_value) {
  static const struct {
    const char *name;
    bool value;
  } opts[] = {{"--mem-limit", true},    {"--no-fuse", false},     {"--dim", true},
              {"--weights", true},      {"--shape", true},        {"--precision", true},
              {"--io-precision", true}, {"--fp32-ops", true},     {"--fp32-nodes", true},
              {"--train", false},       {"--loss", true},         {"--logits", true},
              {"--labels", true},       {"--optimizer", true},    {"--schedule", true},
              {"--clip", true},        {"--data-parallel", false}, {"--bucket-mb", true}};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    size_t n = strlen(opts[i].name);
    if (!strncmp(arg, opts[i].name, n) && (arg[n] == 0 || (arg[n] == '=' && opts[i].value))) {
      *takes_value = opts[i].value && arg[n] == 0;
      return (int)i;
    }
  }
  return -1;
}

int kiln_cmd_train(int argc, char **argv) {
  kiln_model_opts mo = {.train = true};
  kiln_compile_opts co = {.prefix = "model"};
  const char *model = NULL;
  krt_device_kind kind = KRT_DEVICE_AUTO;
  char **rest = calloc((size_t)argc + 2, sizeof *rest);
  int nrest = 0;
  if (!rest) abort();
  rest[nrest++] = "kiln train";
  for (int i = 1; i < argc; i++) {
    char *arg = argv[i];
    bool takes;
    int which = compile_option(arg, &takes);
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
      fputs(help, stdout);
      free(rest);
      return KILN_EXIT_OK;
    }
    if (which < 0) { /* the training program's, or the model */
      if (arg[0] != '-' && !model) model = arg;
      else rest[nrest++] = arg;
      if (!strcmp(arg, "--device") && i + 1 < argc && krt_device_kind_parse(argv[i + 1], &kind)) kind = KRT_DEVICE_AUTO;
      if (!strncmp(arg, "--device=", 9) && krt_device_kind_parse(arg + 9, &kind)) kind = KRT_DEVICE_AUTO;
      /* a value of the program's own options is not the model */
      if (arg[0] == '-' && !strchr(arg, '=') && i + 1 < argc && argv[i + 1][0] != '-' &&
          strcmp(arg, "-h"))
        rest[nrest++] = argv[++i];
      continue;
    }
    char *value = takes ? (i + 1 < argc ? argv[++i] : NULL) : strchr(arg, '=') ? strchr(arg, '=') + 1 : NULL;
    if (takes && !value) {
      fprintf(stderr, "kiln train: %s needs a value\n%s", arg, help);
      free(rest);
      return KILN_EXIT_USAGE;
    }
    int rc = 0;
    if (!strncmp(arg, "--mem-limit", 11)) rc = kiln_parse_mem_limit("train", value, &co.mem_limit);
    else if (!strcmp(arg, "--no-fuse")) co.no_fuse = true;
    else if (strcmp(arg, "--train")) {
      static const int ids[] = {OPT_DIM,        OPT_WEIGHTS,  OPT_SHAPE,     OPT_PRECISION,
                                OPT_IO_PRECISION, OPT_FP32_OPS, OPT_FP32_NODES, 0,
                                OPT_LOSS,       OPT_LOGITS,   OPT_LABELS,    OPT_OPTIMIZER,
                                OPT_SCHEDULE,   OPT_CLIP,     OPT_DATA_PARALLEL, OPT_BUCKET_MB};
      rc = kiln_model_opt(&mo, ids[which - 2], value);
    }
    if (rc) {
      free(rest);
      return KILN_EXIT_USAGE;
    }
  }
  if (!model) {
    fprintf(stderr, "kiln train: no model given\n%s", help);
    free(rest);
    return KILN_EXIT_USAGE;
  }
  rest[nrest] = NULL;
  int rc = KILN_EXIT_ERROR;
  mo.mem_limit = co.mem_limit, mo.no_fuse = co.no_fuse;
  kl_graph *g = kiln_load_model(model, &mo);
  kl_codegen_result cg;
  bool generated = false, made = false;
  void *handle = NULL;
  char dir[4096];
  if (!g) goto done;
  kiln_cutoffs_for_device(kind);
  if (kiln_generate(g, &co, &cg)) goto done;
  generated = true;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/kiln-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!(made = mkdtemp(dir) != NULL)) {
    fprintf(stderr, "kiln: error: cannot make a build folder: %s\n", strerror(errno));
    goto done;
  }
  /* GPU images only when the device will be a GPU (probed for the cut-offs) */
  const krt_model_api *api;
  if (!(handle = kiln_build_host(&cg, dir, kiln_cutoff_sm, &api))) goto done;
  /* under mpirun every rank compiles the same step and joins the others */
  rc = krt_train_main_with(api, nrest, rest, krt_comm_mpi_open);
done:
  if (handle) dlclose(handle);
  if (made) kiln_remove_build_dir(dir);
  if (generated) kl_codegen_result_free(&cg);
  if (g) kl_graph_free(g);
  free(rest);
  return rc;
}
