/* frontend.h - reading models into the IR: the .kl DSL (flex + bison). */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "../ir/ir.h"

typedef struct {
  const char *name;
  int64_t value;
} kl_dim_override;

typedef struct {
  const kl_dim_override *dims; /* --dim NAME=V: replaces `dim NAME = ...` */
  int ndims;
  bool no_load;                /* refuse load("...") (fuzzing) */
} kl_parse_options;

/* Parse a .kl file into a verified graph.  NULL and err (file:line:col) on
 * any syntax, name, type or shape error.  `path` must outlive the graph's
 * locations (it is not copied). */
kl_graph *kl_parse_file(const char *path, const kl_parse_options *opt,
                        kl_error *err);
/* The same from memory; `filename` is used in locations and to resolve
 * load() paths. */
kl_graph *kl_parse_string(const char *text, size_t len, const char *filename,
                          const kl_parse_options *opt, kl_error *err);

#endif
