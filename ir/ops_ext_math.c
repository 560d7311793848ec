/* ops_ext_math.c - shape inference and evaluation of the rows in
 * ops_ext_math.def. */
#include <math.h>

#include "op_impl.h"
