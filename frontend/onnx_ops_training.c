/* onnx_ops_training.c - ops of the ai.onnx.preview.training domain.
 * Gradient differentiates part of the graph with Kiln's own autodiff pass,
 * the same one the .kl train block uses. */
#include <string.h>

#include "../passes/passes.h"
#include "onnx_internal.h"

/* Gradient(xs..., attrs xs, y): output k is d(sum(y))/d(xs[k]). */
static int convert_gradient(kl_onnx_ctx *c, const Onnx__NodeProto *n) {
  const Onnx__AttributeProto *xs = kl_onnx_attr(n, "xs");
  const char *yname = kl_onnx_attr_string(c, n, "y", NULL);
  if (!xs || !xs->n_strings || !yname) return kl_onnx_fail(c, "needs the xs and y attributes");
  if (kl_onnx_attr(n, "zs")) return kl_onnx_unsupported(c, "the zs attribute is not supported");
  if ((int)n->n_output != (int)xs->n_strings)
    return kl_onnx_fail(c, "%zu outputs for %zu xs", n->n_output, xs->n_strings);
  enum { MAX_XS = 64 };
  if (xs->n_strings > MAX_XS) return kl_onnx_fail(c, "more than %d xs", MAX_XS);
  /* The attributes name values of the graph; look them up as inputs. */
  kl_value *x[MAX_XS], *grads[MAX_XS], *y = NULL;
  Onnx__NodeProto probe = *n;
  char *names[MAX_XS + 1];
  probe.input = names;
  probe.n_input = xs->n_strings + 1;
  for (size_t i = 0; i < xs->n_strings; i++) {
    char *s = kl_arena_alloc(&c->g->arena, xs->strings[i].len + 1);
    if (xs->strings[i].len) memcpy(s, xs->strings[i].data, xs->strings[i].len);
    names[i] = s;
  }
  names[xs->n_strings] = (char *)yname;
  for (size_t i = 0; i <= xs->n_strings; i++) {
    kl_value *v = kl_onnx_input(c, &probe, (int)i);
    if (!v) return kl_onnx_fail(c, "'%s' is not a value of the graph", names[i]);
    if (i < xs->n_strings) x[i] = v;
    else y = v;
  }
  kl_error e;
  if (kl_autodiff(c->g, y, x, (int)xs->n_strings, grads, &e)) return kl_onnx_fail(c, "%s", e.msg);
  for (size_t i = 0; i < xs->n_strings; i++)
    if (kl_onnx_bind(c, n, (int)i, grads[i])) return -1;
  return 0;
}

const kl_onnx_op kl_onnx_ops_training[] = {
    {"ai.onnx.preview.training.Gradient", 1, convert_gradient},
    {NULL, 0, NULL},
};
