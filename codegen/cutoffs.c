/* cutoffs.c - the choices between a generated direct kernel and a library
 * call (cuBLAS), per GPU architecture.  The rows come from measurements:
 * bench/gpu-check.sh times both sides of each choice on a lent GPU and
 * prints the row to paste here.  An architecture without a row of its own
 * takes the closest older one of the same major version, else the default
 * (kl_cg_target's own numbers).  KILN_CUTOFFS=name=value,... overrides any
 * of them for one run: that is how the check measures both sides. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen_impl.h"

/* Columns: sm, then each knob's value (-1: kl_cg_target's own). */
typedef struct {
  int sm;                      /* 90 for sm_90; 0: the default row */
  int64_t direct_conv_max_k;   /* -1: kl_cg_target's */
  int64_t direct_matmul_max_k;
  int64_t attention_max_keys;
  int64_t direct_conv_max_macs;
  int64_t direct_matmul_max_macs;
  int64_t direct_conv_min_outputs_per_k;
  int64_t direct_conv_split_below;
  int64_t attention_mma_max_keys;
  const char *source;          /* where the figures came from */
} cutoff_row;

static const cutoff_row rows[] = {
    {0, -1, -1, -1, -1, -1, -1, -1, -1, "kl_cg_target's guesses (no GPU measured)"},
    /* an H200's: fused convolutions up to the longest dot product measured
     * (2304) at any size; GEMMs in the elementwise kernel up to K = 128 and
     * 16.8M multiply-adds; attention through cuBLAS and softmax (the tiled
     * f32 kernel was 1.3-1.7x slower from 128 keys on).  The last column
     * is no sweep's: ResNet-18 at 64x64, batch 1, ran 1.09 ms fused with
     * its long convolutions direct on few outputs (16K down to 2K threads
     * each summing 576 to 4608 products) against 0.36 ms unfused; at 16
     * outputs per unit of K they go to the library.  Attention in halves on
     * the tensor cores (the next column) is no measurement's yet. */
    {90, 2304, 128, 0, -1, 16777216, 16, -1, -1, "NVIDIA H200 (driver 580.159.04), 2026-12-04, bench/gpu-check.sh"},
};

static const struct {
  const char *name;
  size_t offset;
} knobs[] = {
    {"direct_conv_max_k", offsetof(kl_target, direct_conv_max_k)},
    {"direct_matmul_max_k", offsetof(kl_target, direct_matmul_max_k)},
    {"attention_max_keys", offsetof(kl_target, attention_max_keys)},
    {"tile_min_blocks", offsetof(kl_target, tile_min_blocks)},
    {"direct_conv_max_macs", offsetof(kl_target, direct_conv_max_macs)},
    {"direct_matmul_max_macs", offsetof(kl_target, direct_matmul_max_macs)},
    {"direct_conv_min_outputs_per_k", offsetof(kl_target, direct_conv_min_outputs_per_k)},
    {"direct_conv_split_below", offsetof(kl_target, direct_conv_split_below)},
    {"tensor_cores", offsetof(kl_target, tensor_cores)},
    {"attention_mma_max_keys", offsetof(kl_target, attention_mma_max_keys)},
};

static void set(kl_target *t, size_t offset, int64_t v) {
  if (v >= 0) *(int64_t *)((char *)t + offset) = v;
}

static const cutoff_row *row_for(int sm) {
  const cutoff_row *best = &rows[0];
  for (size_t i = 1; i < sizeof rows / sizeof rows[0]; i++)
    if (sm > 0 && rows[i].sm / 10 == sm / 10 && rows[i].sm <= sm && rows[i].sm > best->sm) best = &rows[i];
  return best;
}

int kl_cg_apply_cutoffs(kl_target *t, const char *spec, char *why, size_t why_len) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  for (char *save = NULL, *item = strtok_r(buf, ", ", &save); item; item = strtok_r(NULL, ", ", &save)) {
    char *eq = strchr(item, '=');
    char *end = NULL;
    long long v = eq ? strtoll(eq + 1, &end, 10) : -1;
    size_t i = 0;
    if (eq) *eq = 0;
    while (i < sizeof knobs / sizeof knobs[0] && strcmp(knobs[i].name, item)) i++;
    if (!eq || i == sizeof knobs / sizeof knobs[0] || !end || *end || end == eq + 1 || v < 0) {
      snprintf(why, why_len, "'%s' is not NAME=COUNT with NAME one of direct_conv_max_k, "
                             "direct_matmul_max_k, attention_max_keys, tile_min_blocks, direct_conv_max_macs, "
                             "direct_matmul_max_macs, direct_conv_min_outputs_per_k, direct_conv_split_below, tensor_cores, attention_mma_max_keys", item);
      return -1;
    }
    set(t, knobs[i].offset, v);
  }
  return 0;
}

const kl_target *kl_cg_target_for(int sm) {
  static kl_target t;
  static int warned;
  t = kl_cg_target;
  const cutoff_row *r = row_for(sm);
  set(&t, offsetof(kl_target, direct_conv_max_k), r->direct_conv_max_k);
  set(&t, offsetof(kl_target, direct_matmul_max_k), r->direct_matmul_max_k);
  set(&t, offsetof(kl_target, attention_max_keys), r->attention_max_keys);
  set(&t, offsetof(kl_target, direct_conv_max_macs), r->direct_conv_max_macs);
  set(&t, offsetof(kl_target, direct_matmul_max_macs), r->direct_matmul_max_macs);
  set(&t, offsetof(kl_target, direct_conv_min_outputs_per_k), r->direct_conv_min_outputs_per_k);
  set(&t, offsetof(kl_target, direct_conv_split_below), r->direct_conv_split_below);
  set(&t, offsetof(kl_target, attention_mma_max_keys), r->attention_mma_max_keys);
  const char *env = getenv("KILN_CUTOFFS");
  char why[300];
  kl_target with = t; /* all of it or none */
  if (env && *env) {
    if (!kl_cg_apply_cutoffs(&with, env, why, sizeof why)) t = with;
    else if (!warned++) fprintf(stderr, "kiln: warning: KILN_CUTOFFS ignored: %s\n", why);
  }
  return &t;
}

const char *kl_cg_cutoff_source(int sm) { return row_for(sm)->source; }
