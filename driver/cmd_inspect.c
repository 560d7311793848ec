/* cmd_inspect.c - `kiln inspect`: what a model takes, gives and contains. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char inspect_help[] =
    "usage: kiln inspect MODEL [options]\n"
    "Print inputs, outputs, parameters (count and bytes) and op counts.\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n";

static void print_value(const kl_value *v) {
  char s[160];
  printf("  %-24s %s%s\n", v->name, kl_dtype_name(v->dtype), kl_shape_str(&v->shape, s, sizeof s));
}

int kiln_cmd_inspect(int argc, char **argv) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'}, KILN_MODEL_LONGOPTS, {0}};
  kiln_model_opts mo = {0};
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(inspect_help, stdout); return KILN_EXIT_OK;
    case OPT_DIM:
    case OPT_WEIGHTS:
    case OPT_SHAPE:
      if (kiln_model_opt(&mo, c, optarg)) return KILN_EXIT_USAGE;
      break;
    default: fputs(inspect_help, stderr); return KILN_EXIT_USAGE;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln inspect: expected one MODEL file\n%s", inspect_help);
    return KILN_EXIT_USAGE;
  }
  kl_graph *g = kiln_load_model(argv[optind], &mo);
  if (!g) {
      return KILN_EXIT_ERROR;
  }
  printf("model %s\n", g->name);
  printf("inputs (%d):\n", g->inputs.len);
  for (int i = 0; i < g->inputs.len; i++) print_value(g->inputs.items[i]);
  printf("outputs (%d):\n", g->outputs.len);
  for (int i = 0; i < g->outputs.len; i++) print_value(g->outputs.items[i]);
  int64_t pcount = 0, pbytes = 0, ccount = 0, cbytes = 0;
  for (int i = 0; i < g->params.len; i++) {
    const kl_value *v = g->params.items[i];
    int64_t n = kl_shape_numel(&v->shape);
    if (v->kind == KL_VAL_PARAM) { pcount += n; pbytes += n * (int64_t)kl_dtype_size(v->dtype); }
    else { ccount += n; cbytes += n * (int64_t)kl_dtype_size(v->dtype); }
  }
  printf("params: %d tensors, %lld elements, %lld bytes\n",
         g->params.len, (long long)pcount, (long long)pbytes);
  if (ccount) printf("consts: %lld elements, %lld bytes\n", (long long)ccount, (long long)cbytes);
  int counts[KL_OP_COUNT] = {0};
  for (int i = 0; i < g->nodes.len; i++) counts[g->nodes.items[i]->op]++;
  printf("nodes: %d\n", g->nodes.len);
  for (int op = 0; op < KL_OP_COUNT; op++)
    if (counts[op]) printf("  %-20s %d\n", kl_ops[op].name, counts[op]);
  if (g->train)
    printf("train: loss '%s', optimizer %s\n", g->train->loss, g->train->optimizer);
  kl_graph_free(g);
  return KILN_EXIT_OK;
}
