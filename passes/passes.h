/* passes.h - transformations of IR graphs.  One public header for the
 * passes/ folder. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

/* Reverse-mode differentiation.  Appends to g the nodes that compute the
 * gradient of sum(y) with respect to each of xs (the seed is ones shaped
 * like y), and sets grads[i] to it; a value y does not depend on gets
 * zeros.  An op on the path without a gradient rule is an error naming it.
 * The rules live in autodiff.c, one case per op. */
int kl_autodiff(kl_graph *g, kl_value *y, kl_value *const *xs, int nxs, kl_value **grads,
                kl_error *err);

#endif
