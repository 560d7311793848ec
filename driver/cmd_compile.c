/* cmd_compile.c - `kiln compile`: today it emits the IR text; code
 * generation comes with the codegen issue. */
#include <errno.h>
#include <getopt.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char compile_help[] =
    "usage: kiln compile MODEL --emit=ir|cu [-o OUT] [options]\n"
    "Compile MODEL (.kl or .onnx).\n"
    "  --emit=ir             print the verified IR as text (.kl syntax)\n"
    "  --emit=cu             write kernels.cu, model.c and model.h into folder OUT\n"
    "  -o, --output OUT      the file (ir; default: standard output) or folder (cu)\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n";

enum { OPT_EMIT = 2100 };

int kiln_cmd_compile(int argc, char **argv) {
  static const struct option longopts[] = {
      {"emit", required_argument, NULL, OPT_EMIT},
      {"output", required_argument, NULL, 'o'},
      {"help", no_argument, NULL, 'h'},
      KILN_MODEL_LONGOPTS,
      {0}};
  kiln_model_opts mo = {0};
  const char *emit = NULL, *out_path = NULL;
  int c;
  while ((c = getopt_long(argc, argv, "ho:", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(compile_help, stdout); return KILN_EXIT_OK;
    case 'o': out_path = optarg; break;
    case OPT_EMIT: emit = optarg; break;
    case OPT_DIM:
    case OPT_WEIGHTS:
    case OPT_SHAPE:
      if (kiln_model_opt(&mo, c, optarg)) return KILN_EXIT_USAGE;
      break;
    default: fputs(compile_help, stderr); return KILN_EXIT_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln compile: expected one MODEL file\n%s", compile_help);
    return KILN_EXIT_USAGE;
  }
  if (!emit || (strcmp(emit, "ir") && strcmp(emit, "cu"))) {
    fprintf(stderr, "kiln compile: --emit=%s: choose ir or cu (exe and lib come with the CUDA "
                    "runtime)\n", emit ? emit : "(none)");
    return KILN_EXIT_USAGE;
  }
  if (!strcmp(emit, "cu") && !out_path) {
    fprintf(stderr, "kiln compile: --emit=cu needs -o FOLDER\n");
    return KILN_EXIT_USAGE;
  }
  kl_graph *g = kiln_load_model(argv[optind], &mo);
  int rc = KILN_EXIT_ERROR;
  if (g && !strcmp(emit, "cu")) {
    kl_codegen_result cg;
    kl_error err;
    kl_codegen_options copt = {.prefix = g->name};
    if (kl_codegen(g, &copt, &cg, &err)) {
      kl_error_print(stderr, &err);
    } else {
      if ((mkdir(out_path, 0777) == 0 || errno == EEXIST) && !kiln_write_sources(&cg, out_path)) {
        rc = KILN_EXIT_OK;
        fprintf(stderr, "kiln: wrote %s/kernels.cu (%d kernels), model.c (%d GEMM calls), model.h; "
                        "arena %zu bytes, weights %zu bytes\n", out_path, cg.nkernels, cg.ngemms,
                cg.arena_bytes, cg.param_bytes);
      } else if (rc) {
        fprintf(stderr, "kiln: error: cannot create folder %s: %s\n", out_path, strerror(errno));
      }
      kl_codegen_result_free(&cg);
    }
  } else if (g) {
    FILE *f = out_path ? fopen(out_path, "w") : stdout;
    if (!f) {
      perror(out_path);
    } else {
      kl_print_graph(f, g);
      rc = (ferror(f) | (out_path ? fclose(f) : fflush(f))) ? KILN_EXIT_ERROR : KILN_EXIT_OK;
      if (rc) fprintf(stderr, "kiln: error: writing %s failed\n", out_path ? out_path : "stdout");
    }
  }
  kl_graph_free(g);
  return rc;
}
