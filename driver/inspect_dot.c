/* inspect_dot.c - the graph as Graphviz text, fusion groups drawn as
 * clusters (one cluster, one kernel): `kiln inspect MODEL --dot FILE`. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "driver.h"

/* A DOT string literal's contents: names come from user files. */
static void dot_text(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if (*s == '\n') fputs("\\n", f);
    else fputc(*s, f);
  }
}

static void node_box(FILE *f, const kl_node *n, const char *style) {
  char shape[160];
  fprintf(f, "    n%d [label=\"", n->id);
  dot_text(f, n->name);
  fprintf(f, "\\n%s -> %s%s\"%s];\n", kl_ops[n->op].name, kl_dtype_name(n->outputs[0]->dtype),
          kl_shape_str(&n->outputs[0]->shape, shape, sizeof shape), style);
}

int kiln_write_dot(const kl_graph *g, const kl_codegen_result *cg, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "kiln: error: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  static const char *const kinds[] = {"single", "elementwise", "rows"};
  fprintf(f, "// %s: %d nodes, %d groups, %d kernels (kiln inspect --dot)\n", g->name,
          g->nodes.len, cg->ngroups, cg->nkernels);
  fprintf(f, "digraph \"");
  dot_text(f, g->name);
  fprintf(f, "\" {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int i = 0; i < g->inputs.len; i++) {
    fprintf(f, "  v%d [shape=ellipse, label=\"", g->inputs.items[i]->id);
    dot_text(f, g->inputs.items[i]->name);
    fprintf(f, "\"];\n");
  }
  /* a cluster per group of two or more; single nodes on their own */
  for (int gi = 0; gi < cg->ngroups; gi++) {
    int members = 0;
    for (int i = 0; i < g->nodes.len; i++) members += cg->node_group[i] == gi;
    if (members > 1)
      fprintf(f, "  subgraph cluster_%d {\n    label=\"group %d: %s, one kernel\";\n"
                 "    style=filled; color=lightblue;\n", gi, gi, kinds[cg->group_kind[gi]]);
    for (int i = 0; i < g->nodes.len; i++)
      if (cg->node_group[i] == gi) node_box(f, g->nodes.items[i], "");
    if (members > 1) fprintf(f, "  }\n");
  }
  for (int i = 0; i < g->nodes.len; i++) { /* views, folded and dead nodes: no kernel */
    const kl_node *n = g->nodes.items[i];
    if (cg->node_group[i] < 0) node_box(f, n, ", style=dashed");
  }
  for (int i = 0; i < g->nodes.len; i++) {
    const kl_node *n = g->nodes.items[i];
    for (int k = 0; k < n->ninputs; k++) {
      const kl_value *v = n->inputs[k];
      if (v->producer) fprintf(f, "  n%d -> n%d;\n", v->producer->id, n->id);
      else if (v->kind == KL_VAL_INPUT) fprintf(f, "  v%d -> n%d;\n", v->id, n->id);
    }
  }
  fprintf(f, "}\n");
  if (fclose(f)) {
    fprintf(stderr, "kiln: error: writing %s failed\n", path);
    return -1;
  }
  return 0;
}
