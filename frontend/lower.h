/* lower.h - grammar actions: build the IR while parsing (internal). */
#ifndef KILN_LOWER_H
#define KILN_LOWER_H
#include "parse_state.h"

kl_loc kl_p_loc(kl_parser *P, int line, int col);
int kl_p_model(kl_parser *P, const char *name, kl_loc loc);
int kl_p_dim(kl_parser *P, const char *name, int64_t value, kl_loc loc);
int kl_p_dim_value(kl_parser *P, const char *name, kl_loc loc, int64_t *out);
void kl_p_shape_begin(kl_parser *P, int64_t dtype);
int kl_p_shape_push(kl_parser *P, int64_t dim, kl_loc loc);
int kl_p_input(kl_parser *P, const char *name, kl_loc loc);
int kl_p_param(kl_parser *P, kl_value_kind kind, const char *name, kl_loc loc);
int kl_p_init(kl_parser *P, const char *name, kl_loc loc);
void kl_p_frame_begin(kl_parser *P);
void kl_p_arg_pos(kl_parser *P, const kl_expr *e);
void kl_p_arg_posattr(kl_parser *P, const kl_attr *a);
int kl_p_arg_kw(kl_parser *P, const char *name, const kl_attr *a, kl_loc loc);
void kl_p_names_reset(kl_parser *P);
void kl_p_names_push(kl_parser *P, const char *name, kl_loc loc);
int kl_p_let(kl_parser *P, const kl_expr *e);
int kl_p_output_name(kl_parser *P, const char *name, kl_loc loc);
int kl_p_output_expr(kl_parser *P, const char *name, kl_loc loc, const kl_expr *e);
int kl_p_loss(kl_parser *P, const kl_expr *e, kl_loc loc);
int kl_p_optimizer(kl_parser *P, const char *name, kl_loc loc);
int kl_p_schedule(kl_parser *P, const char *name, kl_loc loc);
int kl_p_clip(kl_parser *P, const kl_expr *e, kl_loc loc);
int kl_p_train_end(kl_parser *P, kl_loc loc);
int kl_p_binary(kl_parser *P, kl_op op, const kl_expr *a, const kl_expr *b,
                kl_loc loc, kl_expr *out);
int kl_p_neg(kl_parser *P, const kl_expr *a, kl_loc loc, kl_expr *out);
void kl_p_number(kl_parser *P, double v, kl_loc loc, kl_expr *out);
int kl_p_ident(kl_parser *P, const char *name, kl_loc loc, kl_expr *out);
void kl_p_ident_attr(kl_parser *P, const char *name, kl_attr *out);
int kl_p_call(kl_parser *P, const char *name, kl_loc loc, kl_expr *out);
void kl_p_list_begin(kl_parser *P);
void kl_p_list_push(kl_parser *P, double v, bool is_float);
void kl_p_list_end(kl_parser *P, kl_attr *out);
#endif
