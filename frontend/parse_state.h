/* parse_state.h - state shared by the lexer, the grammar and lower.c
 * (internal to frontend/). */
#ifndef KILN_PARSE_STATE_H
#define KILN_PARSE_STATE_H

#include "frontend.h"

/* An expression: a graph value, a number not yet given a dtype (it takes
 * the dtype of the value it meets), or a node with several outputs waiting
 * for a `let a, b = ...`. */
typedef struct {
  kl_value *v;
  kl_node *multi;
  double lit;
  bool is_lit;
  kl_loc loc;
} kl_expr;

typedef struct {
  const char *name;
  kl_value *v;      /* NULL for numbers (let eps = 1e-5) and dims */
  double lit;
  bool is_dim;
} kl_symbol;

/* Arguments of the call being parsed; calls nest, so frames stack. */
typedef struct {
  kl_expr *pos;     int npos, cappos;
  kl_attr *posattr; int nposattr, capposattr; /* initialiser arguments */
  kl_attr *kw;      int nkw, capkw;
  kl_loc *kwloc;
} kl_frame;

typedef struct kl_parser {
  kl_graph *g;
  const char *file;
  const kl_parse_options *opt;
  kl_error *err;
  bool failed;
  int line, col;
  bool in_train;
  int depth;         /* open ( and [ at the current token */
  kl_arena tmp;      /* strings and lists of this parse */

  kl_symbol *syms; int nsyms, capsyms;
  int *sym_slots; int capslots;  /* hash index: name -> index in syms + 1 */
  bool *bound; int capbound;     /* per value id: some symbol names it */
  kl_frame *frames; int nframes, capframes;
  const char **names; kl_loc *name_locs; int nnames, capnames; /* let a, b */
  kl_shape shape; kl_dtype decl_dtype;
  kl_init pending_init; kl_attr pending_values; /* the declaration's initialiser */
  double *list; int nlist, caplist; bool list_float;
  bool seen_model, seen_train;
  kl_loc min_lr_loc;  /* the schedule's min_lr, checked against lr at the end */
} kl_parser;

void kl_parser_fail(kl_parser *P, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
char *kl_parser_strdup(kl_parser *P, const char *s);
/* True for the words the lexer reserves (keywords, dtypes, true, ...). */
bool kl_is_keyword(const char *s);
char *kl_parser_unescape(kl_parser *P, const char *s, int len);
#endif
