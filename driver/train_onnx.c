/* train_onnx.c - the train block of an ONNX model, from the command line:
 * --loss=cross_entropy|mse --logits NAME --labels NAME, and optionally
 * --optimizer 'adamw(lr=1e-3)', --schedule 'cosine(warmup=100)', --clip X
 * (the same settings as a .kl train block, docs/DSL.md).  The loss is
 * appended to the graph; the training compile does the rest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* The keywords each optimizer and schedule takes (docs/DSL.md, the .kl
 * parser checks the same in frontend/lower.c). */
static const char *const optimizer_keys[][6] = {
    {"sgd", "lr", "momentum", "nesterov", "weight_decay", NULL},
    {"adam", "lr", "beta1", "beta2", "eps", "weight_decay"},
    {"adamw", "lr", "beta1", "beta2", "eps", "weight_decay"},
};
static const char *const schedule_keys[][4] = {
    {"constant", "warmup", NULL, NULL},
    {"step", "warmup", "step_size", "gamma"},
    {"cosine", "warmup", "total", "min_lr"},
};

/* "name(k=v, ...)" into *name and float attrs in g's arena; -1 after
 * printing what is wrong. */
static int parse_call(kl_graph *g, const char *flag, const char *spec, const char *const *keys,
                      int nrows, int width, const char **name, kl_attr **attrs, int *nattrs) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  char *open = strchr(buf, '('), *close = strrchr(buf, ')');
  if (!open || !close || close < open || close[1]) {
    fprintf(stderr, "kiln: error: %s '%s': write NAME(KEY=VALUE, ...), e.g. %s\n", flag, spec,
            !strcmp(flag, "--optimizer") ? "adamw(lr=1e-3)" : "cosine(warmup=100)");
    return -1;
  }
  *open = *close = 0;
  const char *const *row = NULL;
  for (int r = 0; r < nrows; r++)
    if (!strcmp(keys[r * width], buf)) row = keys + r * width;
  if (!row) {
    fprintf(stderr, "kiln: error: %s: unknown '%s' (expected %s)\n", flag, buf,
            !strcmp(flag, "--optimizer") ? "sgd, adam or adamw" : "constant, step or cosine");
    return -1;
  }
  *name = kl_arena_strdup(&g->arena, buf);
  *attrs = kl_arena_alloc(&g->arena, 8 * sizeof **attrs);
  *nattrs = 0;
  for (char *kv = strtok(open + 1, ","); kv; kv = strtok(NULL, ",")) {
    char *eq = strchr(kv, '='), *end;
    while (*kv == ' ') kv++;
    if (!eq) {
      fprintf(stderr, "kiln: error: %s: '%s' is not KEY=VALUE\n", flag, kv);
      return -1;
    }
    *eq = 0;
    for (char *e = eq - 1; e >= kv && *e == ' '; e--) *e = 0;
    bool known = false;
    for (int k = 1; k < width && row[k]; k++) known |= !strcmp(row[k], kv);
    double v = strtod(eq + 1, &end);
    while (*end == ' ') end++;
    if (!known || *end || end == eq + 1 || !isfinite(v) || v < 0 || *nattrs == 8) {
      fprintf(stderr, "kiln: error: %s: %s %s '%s'\n", flag, *name,
              known ? "takes a finite number >= 0 for" : "has no setting", kv);
      return -1;
    }
    (*attrs)[(*nattrs)++] = (kl_attr){.name = kl_arena_strdup(&g->arena, kv), .kind = KL_ATTR_FLOAT, .f = v};
  }
  return 0;
}

static kl_value *find_named(const kl_graph *g, const char *name) {
  kl_value *v = kl_graph_find_value(g, name);
  for (int i = 0; !v && i < g->values.len; i++)
    if (g->values.items[i]->label && !strcmp(g->values.items[i]->label, name)) v = g->values.items[i];
  return v;
}

int kiln_onnx_train_block(kl_graph *g, const kiln_model_opts *o) {
  if (!o->loss || !o->logits || !o->labels) {
    fprintf(stderr, "kiln: error: --train of an ONNX model needs --loss=cross_entropy|mse, "
                    "--logits NAME (the value the loss reads) and --labels NAME (an input, "
                    "made when the model has none)\n");
    return -1;
  }
  bool ce = !strcmp(o->loss, "cross_entropy");
  if (!ce && strcmp(o->loss, "mse")) {
    fprintf(stderr, "kiln: error: --loss=%s: expected cross_entropy or mse\n", o->loss);
    return -1;
  }
  kl_value *logits = find_named(g, o->logits), *labels = find_named(g, o->labels);
  if (!logits || !kl_dtype_is_float(logits->dtype)) {
    fprintf(stderr, "kiln: error: --logits %s: %s of model '%s'\n", o->logits,
            logits ? "not a float value" : "no value", g->name);
    return -1;
  }
  kl_error err;
  kl_loc here = {0};
  if (!labels) { /* class indices, or targets shaped like the logits */
    kl_shape s = logits->shape;
    if (ce) s.rank--;
    labels = kl_graph_add_input(g, kl_graph_fresh_value_name(g, o->labels), ce ? KL_I64 : logits->dtype,
                                &s, here);
  } else if (labels->kind != KL_VAL_INPUT) {
    fprintf(stderr, "kiln: error: --labels %s: a value computed by the model, not an input\n", o->labels);
    return -1;
  }
  kl_node *n;
  kl_value *ins[2] = {logits, labels};
  const char *loss_name = kl_graph_fresh_value_name(g, "loss");
  if (ce) {
    n = kl_graph_add_node(g, KL_OP_CROSS_ENTROPY, "loss", ins, 2, NULL, 0, &loss_name, 1, here, &err);
  } else {
    kl_node *d = kl_graph_add_node(g, KL_OP_SUB, NULL, ins, 2, NULL, 0, NULL, 0, here, &err);
    kl_value *sq[2] = {d ? d->outputs[0] : NULL, d ? d->outputs[0] : NULL};
    kl_node *m = d ? kl_graph_add_node(g, KL_OP_MUL, NULL, sq, 2, NULL, 0, NULL, 0, here, &err) : NULL;
    n = m ? kl_graph_add_node(g, KL_OP_REDUCE_MEAN, "loss", &m->outputs[0], 1, NULL, 0, &loss_name, 1,
                              here, &err)
          : NULL;
  }
  if (!n) {
    fprintf(stderr, "kiln: error: --loss=%s on %s and %s: %s\n", o->loss, o->logits, o->labels, err.msg);
    return -1;
  }
  kl_train *t = kl_arena_alloc(&g->arena, sizeof *t);
  t->loss = n->outputs[0]->name;
  const char *opt = o->optimizer ? o->optimizer : "adam(lr=1e-3)";
  if (parse_call(g, "--optimizer", opt, &optimizer_keys[0][0], 3, 6, &t->optimizer, &t->attrs, &t->nattrs) ||
      (o->schedule && parse_call(g, "--schedule", o->schedule, &schedule_keys[0][0], 3, 4, &t->schedule,
                                 &t->schedule_attrs, &t->nschedule_attrs)))
    return -1;
  bool has_lr = false;
  for (int i = 0; i < t->nattrs; i++) has_lr |= !strcmp(t->attrs[i].name, "lr") && t->attrs[i].f > 0;
  if (!has_lr) {
    fprintf(stderr, "kiln: error: --optimizer %s: needs lr > 0, e.g. %s(lr=1e-3)\n", opt, t->optimizer);
    return -1;
  }
  t->clip = o->clip;
  g->train = t;
  return 0;
}
