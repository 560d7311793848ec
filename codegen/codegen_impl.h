/* codegen_impl.h - shared by the files of codegen/ (internal). */
#ifndef KILN_CODEGEN_IMPL_H
#define KILN_CODEGEN_IMPL_H

#include <stdio.h>

#include "codegen.h"

const char *kl_cg_storage(kl_dtype t);
bool kl_cg_is_elementwise(const kl_node *n);
/* Kernel writers: each emits one kernel named `name` and its emulator
 * entry for node n. */
void kl_cg_elementwise(FILE *f, const char *name, const kl_node *n);
void kl_cg_gather_copy(FILE *f, const char *name, const kl_node *n);
void kl_cg_softmax(FILE *f, const char *name, const kl_node *n);
void kl_cg_reduce(FILE *f, const char *name, const kl_node *n);

#endif
