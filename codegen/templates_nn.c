/* templates_nn.c - kernel templates for the nn ops (see
 * codegen_impl.h for the template interface). */
#include "codegen_impl.h"

const kl_cg_template kl_cg_templates_nn[] = {
    {NULL, NULL},
};
