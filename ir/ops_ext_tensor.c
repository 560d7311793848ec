/* ops_ext_tensor.c - shape inference and evaluation of the rows in
 * ops_ext_tensor.def. */
#include <math.h>

#include "op_impl.h"
