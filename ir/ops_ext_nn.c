/* ops_ext_nn.c - shape inference and evaluation of the rows in
 * ops_ext_nn.def. */
#include <math.h>

#include "op_impl.h"
