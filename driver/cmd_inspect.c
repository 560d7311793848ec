/* cmd_inspect.c - `kiln inspect`: what a model takes, gives and contains. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

static const char inspect_help[] =
    "usage: kiln inspect MODEL [options]\n"
    "Print inputs, outputs, parameters (count and bytes) and op counts; with\n"
    "--precision (or --io-precision, --fp32-ops, --fp32-nodes) also the type and\n"
    "class (allow, deny, follow, keep) chosen for each node.  An ONNX model with\n"
    "symbolic input dims and no --shape or --dim: its inputs and outputs as\n"
    "declared, and the flags that bind them.\n"
    "  --memplan FILE.svg    compile the model and draw its memory plan (buffers\n"
    "                        over schedule steps); print the planned arena, the\n"
    "                        lower bound and the naive sum\n"
    "  --dot FILE            write the graph for Graphviz, each fusion group (one\n"
    "                        kernel) a cluster; dashed: no kernel (folded, views)\n"
    "  --no-fuse             with --memplan or --dot: one kernel per node\n"
    KILN_MODEL_HELP
    "  -h, --help            show this help\n"
    "With --precision, each node left in fp32 says why: its op's class, the\n"
    "lists, a weight or attribute the low type cannot hold, or the fp32 inputs\n"
    "it follows.\n";

enum { OPT_MEMPLAN = 2200, OPT_DOT, OPT_NO_FUSE };

/* Compile g, print the three numbers of its memory plan and draw it, and
 * the graph with its fusion groups. */
static int compiled(const kl_graph *g, const char *svg, const char *dot, bool no_fuse) {
  kl_codegen_result cg;
  kiln_compile_opts copt = {.no_fuse = no_fuse};
  if (kiln_generate(g, &copt, &cg)) return KILN_EXIT_ERROR;
  printf("memory plan: arena %zu bytes, lower bound %zu, naive sum %zu (planned / lower bound "
         "%.3f; %d buffers, %d steps)\n", cg.arena_bytes, cg.arena_lower_bound, cg.naive_bytes,
         cg.arena_lower_bound ? (double)cg.arena_bytes / (double)cg.arena_lower_bound : 1.0,
         cg.nmembufs, cg.nsteps);
  printf("kernels: %d (%d groups, %d nodes fused), GEMM calls %d, launches %d, est. DRAM bytes "
         "%zu\n", cg.nkernels, cg.ngroups, cg.nfused_nodes, cg.ngemms, cg.nlaunches, cg.dram_bytes);
  int rc = KILN_EXIT_OK;
  if (svg && kiln_write_memplan_svg(&cg, g->name, svg)) rc = KILN_EXIT_ERROR;
  if (dot && kiln_write_dot(g, &cg, dot)) rc = KILN_EXIT_ERROR;
  kl_codegen_result_free(&cg);
  return rc;
}

static void print_value(const kl_value *v) {
  char s[160];
  printf("  %-24s %s%s", kl_value_label(v), kl_dtype_name(v->dtype),
         kl_shape_str(&v->shape, s, sizeof s));
  if (v->label) printf("  (%s in the IR)", v->name); /* what --emit=ir prints */
  printf("\n");
}

static void print_settings(const kl_attr *attrs, int n) {
  printf("(");
  for (int k = 0; k < n; k++) printf("%s%s=%.9g", k ? ", " : "", attrs[k].name, attrs[k].f);
  printf(")");
}

/* The train block as given; settings left out take the defaults of
 * docs/DSL.md. */
static void print_train(const kl_train *t) {
  printf("train: loss '%s', optimizer %s", t->loss, t->optimizer);
  print_settings(t->attrs, t->nattrs);
  printf("\n  schedule: %s", t->schedule ? t->schedule : "constant");
  if (t->schedule) print_settings(t->schedule_attrs, t->nschedule_attrs);
  if (t->clip) printf("\n  clip: gradients scaled to a global norm of at most %.9g\n", t->clip);
  else printf("\n  clip: none\n");
}

/* After the precision pass: each node, in run order, with the type it
 * computes in, its class, and for a float node left in fp32 why: its op's
 * class, the user's lists, a number the low type cannot hold, or its
 * inputs (a follow node over weights alone: its readers). */
static void print_precision(const kl_graph *g, const kiln_model_opts *mo) {
  kl_node **order = calloc((size_t)g->nodes.len + 1, sizeof *order);
  if (!order) abort();
  kl_error err;
  if (kl_topo_order(g, order, &err)) /* cyclic: creation order */
    memcpy(order, g->nodes.items, (size_t)g->nodes.len * sizeof *order);
  printf("precision %s, inputs and outputs %s (node, op, type, class, why fp32):\n",
         kl_dtype_name(mo->prec.low), mo->prec.io_set ? kl_dtype_name(mo->prec.io) : "as declared");
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = order[i];
    kl_dtype t = kl_precision_node_dtype(n);
    kl_precision_class c = kl_precision_node_class(n, &mo->prec);
    char buf[512];
    const char *why = NULL;
    if (t == KL_F32 && mo->prec.low != KL_F32 && c != KL_PREC_KEEP) {
      why = kl_precision_fp32_reason(g, n, &mo->prec, buf, sizeof buf);
      if (why) c = KL_PREC_DENY; /* as the pass took it */
      else why = "follows its fp32 inputs (or readers, over weights alone)";
    }
    printf("  %-32s %-18s %-5s ", n->name, kl_ops[n->op].name, kl_dtype_name(t));
    if (why) printf("%-6s %s\n", kl_precision_class_name(c), why);
    else printf("%s\n", kl_precision_class_name(c));
  }
  free(order);
}

/* An ONNX model whose inputs have symbolic dims cannot be loaded before
 * they are bound: its inputs and outputs as declared, and the flags that
 * bind them.  1 when printed, 0 when every dim is static, -1 on error. */
static int print_unbound_signature(const char *path) {
  kl_onnx_signature sig;
  kl_error err;
  if (kl_onnx_read_signature(path, &sig, &err)) {
    kl_error_print(stderr, &err);
    return -1;
  }
  if (!sig.nsymbolic) {
    kl_onnx_signature_free(&sig);
    return 0;
  }
  char t[600];
  printf("model %s (symbolic dims not bound)\ninputs (%d):\n", path, sig.ninputs);
  for (int i = 0; i < sig.ninputs; i++)
    printf("  %-24s %s\n", sig.inputs[i].name, kl_onnx_io_str(&sig.inputs[i], t, sizeof t));
  printf("outputs (%d):\n", sig.noutputs);
  for (int i = 0; i < sig.noutputs; i++)
    printf("  %-24s %s\n", sig.outputs[i].name, kl_onnx_io_str(&sig.outputs[i], t, sizeof t));
  /* the flags, with 1 for each symbolic dim as an example */
  printf("bind the symbolic dims to see params, nodes and plans:");
  for (int i = 0; i < sig.ninputs; i++) {
    const kl_onnx_io *io = &sig.inputs[i];
    bool symbolic = false;
    for (int d = 0; d < io->rank; d++) symbolic |= io->dim_names[d][0] != 0;
    if (!symbolic) continue;
    printf(" --shape %s=", io->name);
    for (int d = 0; d < io->rank; d++)
      printf("%s%lld", d ? "," : "", io->dim_names[d][0] ? 1LL : (long long)io->dims[d]);
  }
  printf("\n  or, by name:");
  for (int i = 0, shown = 0; i < sig.ninputs; i++)
    for (int d = 0; d < sig.inputs[i].rank; d++) {
      const char *name = sig.inputs[i].dim_names[d];
      bool seen = false; /* a name shared by inputs is one dim */
      for (int j = 0; j <= i && !seen; j++)
        for (int e = 0; e < (j < i ? sig.inputs[j].rank : d); e++)
          seen |= !strcmp(sig.inputs[j].dim_names[e], name);
      if (*name && !seen && shown++ < 16) printf(" --dim %s=1", name);
    }
  printf("\n");
  kl_onnx_signature_free(&sig);
  return 1;
}

int kiln_cmd_inspect(int argc, char **argv) {
  static const struct option longopts[] = {
      {"help", no_argument, NULL, 'h'}, {"memplan", required_argument, NULL, OPT_MEMPLAN},
      {"dot", required_argument, NULL, OPT_DOT}, {"no-fuse", no_argument, NULL, OPT_NO_FUSE},
      KILN_MODEL_LONGOPTS, {0}};
  kiln_model_opts mo = {0};
  const char *svg = NULL, *dot = NULL;
  bool no_fuse = false;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'h': fputs(inspect_help, stdout); return KILN_EXIT_OK;
    case OPT_MEMPLAN: svg = optarg; break;
    case OPT_DOT: dot = optarg; break;
    case OPT_NO_FUSE: no_fuse = true; break;
    default:
      if (kiln_model_opt_or_usage(&mo, c, optarg, inspect_help)) return KILN_EXIT_USAGE;
      break;
    }
  }
  if (optind != argc - 1) {
    fprintf(stderr, "kiln inspect: expected one MODEL file\n%s", inspect_help);
    return KILN_EXIT_USAGE;
  }
  if (kiln_is_onnx(argv[optind]) && !mo.nshapes && !mo.ndims) {
    int shown = print_unbound_signature(argv[optind]);
    if (shown > 0 && (svg || dot))
      fprintf(stderr, "kiln inspect: --memplan and --dot compile the model: bind its symbolic "
                      "dims first\n");
    if (shown) return shown > 0 && !svg && !dot ? KILN_EXIT_OK : KILN_EXIT_ERROR;
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
  if (g->train) print_train(g->train);
  if (mo.precision) print_precision(g, &mo);
  int rc = svg || dot ? compiled(g, svg, dot, no_fuse) : KILN_EXIT_OK;
  kl_graph_free(g);
  return rc;
}
