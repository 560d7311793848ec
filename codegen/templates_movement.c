/* templates_movement.c - kernel templates for the movement ops (see
 * codegen_impl.h for the template interface). */
#include "codegen_impl.h"

const kl_cg_template kl_cg_templates_movement[] = {
    {NULL, NULL},
};
