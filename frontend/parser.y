/* parser.y - the grammar of the .kl language.  Actions call lower.c, which
 * builds the IR as it goes. */
%code requires {
#include "parse_state.h"
typedef void *yyscan_t;
}
%code provides {
#include "lower.h"
}
%code {
int kl_yylex(KL_YYSTYPE *lval, KL_YYLTYPE *lloc, yyscan_t scanner);
static void kl_yyerror(KL_YYLTYPE *loc, yyscan_t scanner, kl_parser *P, const char *msg) {
  (void)scanner;
  kl_parser_fail(P, loc->first_line, loc->first_column, "%s", msg);
}
#define LOC(l) kl_p_loc(P, (l).first_line, (l).first_column)
#define CHECK(x) do { if ((x) != 0) YYABORT; } while (0)
}

%define api.pure full
%define api.prefix {kl_yy}
%define parse.error verbose
%locations
%lex-param {yyscan_t scanner}
%parse-param {yyscan_t scanner} {kl_parser *P}

%union {
  char *str;
  double num;
  int64_t ival;
  kl_expr ex;
  kl_attr attr;
}

%token MODEL "'model'" DIM "'dim'" INPUT "'input'" PARAM "'param'" CONST "'const'"
%token LET "'let'" OUTPUT "'output'" TRAIN "'train'" LOSS "'loss'" OPTIMIZER "'optimizer'"
%token SCHEDULE "'schedule'" CLIP "'clip'"
%token EQ "'=='" NE "'!='" LE "'<='" GE "'>='"
%token <str> IDENT "name" STRING "string"
%token <ival> INT "integer" BOOL "true or false" DTYPE "dtype"
%token <num> FLOAT "number"

%type <ex> expr primary call
%type <attr> attrval
%type <ival> dimval

%nonassoc EQ NE '<' LE '>' GE
%left '+' '-'
%left '*' '/' '@'
%precedence UMINUS

%%

program:
    %empty
  | program stmt
  ;

stmt:
    MODEL IDENT                       { CHECK(kl_p_model(P, $2, LOC(@2))); }
  | DIM IDENT '=' INT                 { CHECK(kl_p_dim(P, $2, $4, LOC(@2))); }
  | INPUT IDENT ':' type              { CHECK(kl_p_input(P, $2, LOC(@2))); }
  | PARAM IDENT ':' type '=' init     { CHECK(kl_p_param(P, KL_VAL_PARAM, $2, LOC(@2))); }
  | CONST IDENT ':' type '=' init     { CHECK(kl_p_param(P, KL_VAL_CONST, $2, LOC(@2))); }
  | LET names '=' expr                { CHECK(kl_p_let(P, &$4)); }
  | OUTPUT outnames
  | OUTPUT IDENT '=' expr             { CHECK(kl_p_output_expr(P, $2, LOC(@2), &$4)); }
  | TRAIN '{' train_items '}'         { CHECK(kl_p_train_end(P, LOC(@1))); }
  ;

type:
    DTYPE '[' { kl_p_shape_begin(P, $1); } dims_opt ']'
  ;

dims_opt:
    %empty
  | dims
  ;

dims:
    dimval                            { CHECK(kl_p_shape_push(P, $1, LOC(@1))); }
  | dims ',' dimval                   { CHECK(kl_p_shape_push(P, $3, LOC(@3))); }
  ;

dimval:
    INT                               { $$ = $1; }
  | IDENT                             { CHECK(kl_p_dim_value(P, $1, LOC(@1), &$$)); }
  ;

init:
    IDENT                             { kl_p_frame_begin(P); CHECK(kl_p_init(P, $1, LOC(@1))); }
  | IDENT '(' { kl_p_frame_begin(P); } initargs_opt ')' { CHECK(kl_p_init(P, $1, LOC(@1))); }
  ;

initargs_opt:
    %empty
  | initargs
  ;

initargs:
    initarg
  | initargs ',' initarg
  ;

initarg:
    attrval                           { kl_p_arg_posattr(P, &$1); }
  | IDENT '=' attrval                 { CHECK(kl_p_arg_kw(P, $1, &$3, LOC(@1))); }
  ;

names:
    IDENT                             { kl_p_names_reset(P); kl_p_names_push(P, $1, LOC(@1)); }
  | names ',' IDENT                   { kl_p_names_push(P, $3, LOC(@3)); }
  ;

outnames:
    IDENT                             { CHECK(kl_p_output_name(P, $1, LOC(@1))); }
  | outnames ',' IDENT                { CHECK(kl_p_output_name(P, $3, LOC(@3))); }
  ;

train_items:
    %empty
  | train_items train_item
  ;

train_item:
    LOSS '=' expr                     { CHECK(kl_p_loss(P, &$3, LOC(@1))); }
  | OPTIMIZER '=' IDENT '(' { kl_p_frame_begin(P); } initargs_opt ')'
                                      { CHECK(kl_p_optimizer(P, $3, LOC(@3))); }
  | SCHEDULE '=' IDENT '(' { kl_p_frame_begin(P); } initargs_opt ')'
                                      { CHECK(kl_p_schedule(P, $3, LOC(@3))); }
  | CLIP '=' expr                     { CHECK(kl_p_clip(P, &$3, LOC(@1))); }
  ;

expr:
    expr '+' expr                     { CHECK(kl_p_binary(P, KL_OP_ADD, &$1, &$3, LOC(@2), &$$)); }
  | expr '-' expr                     { CHECK(kl_p_binary(P, KL_OP_SUB, &$1, &$3, LOC(@2), &$$)); }
  | expr '*' expr                     { CHECK(kl_p_binary(P, KL_OP_MUL, &$1, &$3, LOC(@2), &$$)); }
  | expr '/' expr                     { CHECK(kl_p_binary(P, KL_OP_DIV, &$1, &$3, LOC(@2), &$$)); }
  | expr '@' expr                     { CHECK(kl_p_binary(P, KL_OP_MATMUL, &$1, &$3, LOC(@2), &$$)); }
  | expr EQ expr                      { CHECK(kl_p_binary(P, KL_OP_EQ, &$1, &$3, LOC(@2), &$$)); }
  | expr NE expr                      { CHECK(kl_p_binary(P, KL_OP_NE, &$1, &$3, LOC(@2), &$$)); }
  | expr '<' expr                     { CHECK(kl_p_binary(P, KL_OP_LT, &$1, &$3, LOC(@2), &$$)); }
  | expr LE expr                      { CHECK(kl_p_binary(P, KL_OP_LE, &$1, &$3, LOC(@2), &$$)); }
  | expr '>' expr                     { CHECK(kl_p_binary(P, KL_OP_GT, &$1, &$3, LOC(@2), &$$)); }
  | expr GE expr                      { CHECK(kl_p_binary(P, KL_OP_GE, &$1, &$3, LOC(@2), &$$)); }
  | '-' expr %prec UMINUS             { CHECK(kl_p_neg(P, &$2, LOC(@1), &$$)); }
  | primary                           { $$ = $1; }
  ;

primary:
    INT                               { kl_p_number(P, (double)$1, LOC(@1), &$$); }
  | FLOAT                             { kl_p_number(P, $1, LOC(@1), &$$); }
  | IDENT                             { CHECK(kl_p_ident(P, $1, LOC(@1), &$$)); }
  | call                              { $$ = $1; }
  | '(' expr ')'                      { $$ = $2; }
  ;

call:
    IDENT '(' { kl_p_frame_begin(P); } args_opt ')' { CHECK(kl_p_call(P, $1, LOC(@1), &$$)); }
  ;

args_opt:
    %empty
  | args
  ;

args:
    arg
  | args ',' arg
  ;

arg:
    expr                              { kl_p_arg_pos(P, &$1); }
  | IDENT '=' attrval                 { CHECK(kl_p_arg_kw(P, $1, &$3, LOC(@1))); }
  ;

attrval:
    INT                               { $$ = (kl_attr){.kind = KL_ATTR_INT, .i = $1}; }
  | '-' INT                           { $$ = (kl_attr){.kind = KL_ATTR_INT, .i = -$2}; }
  | FLOAT                             { $$ = (kl_attr){.kind = KL_ATTR_FLOAT, .f = $1}; }
  | '-' FLOAT                         { $$ = (kl_attr){.kind = KL_ATTR_FLOAT, .f = -$2}; }
  | BOOL                              { $$ = (kl_attr){.kind = KL_ATTR_INT, .i = $1}; }
  | STRING                            { $$ = (kl_attr){.kind = KL_ATTR_STRING, .s = $1}; }
  | DTYPE                             { $$ = (kl_attr){.kind = KL_ATTR_DTYPE, .i = $1}; }
  | IDENT                             { kl_p_ident_attr(P, $1, &$$); }
  | '[' { kl_p_list_begin(P); } list_opt ']' { kl_p_list_end(P, &$$); }
  ;

list_opt:
    %empty
  | list
  ;

list:
    listitem
  | list ',' listitem
  ;

listitem:
    INT                               { kl_p_list_push(P, (double)$1, false); }
  | '-' INT                           { kl_p_list_push(P, -(double)$2, false); }
  | FLOAT                             { kl_p_list_push(P, $1, true); }
  | '-' FLOAT                         { kl_p_list_push(P, -$2, true); }
  | IDENT                             { int64_t v; CHECK(kl_p_dim_value(P, $1, LOC(@1), &v));
                                        kl_p_list_push(P, (double)v, false); }
  ;

%%
