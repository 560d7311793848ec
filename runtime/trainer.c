/* trainer.c - a compiled training step driven from the host: the step's
 * scalars (learning rate from the schedule, Adam's bias corrections, the
 * loss scale) computed each step, the loss scaler, the state read and
 * written by name, and checkpoints.  The training program (train_main.c)
 * and users of --emit=lib call the same functions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kilnrt.h"

struct krt_trainer {
  const krt_model_api *api;
  const krt_train_info *t;
  void *model;
  const void **in;
  void **out;
  float scalars[6]; /* lr, bias1, bias2, scale, apply, world */
  int ranks;        /* of a data-parallel run: checkpoints record it */
  int64_t step, total, updates; /* steps taken, of the run, updates applied */
  krt_loss_scaler scaler;
};

static size_t io_bytes(const krt_io_desc *d) {
  size_t n = krt_dtype_size(d->dtype);
  for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];
  return n;
}

static int fail(char *err, size_t errlen, const char *fmt, const char *a) {
  if (err && errlen) snprintf(err, errlen, fmt, a);
  return -1;
}

void krt_trainer_destroy(krt_trainer *t) {
  if (!t) return;
  if (t->model) t->api->destroy(t->model);
  for (int i = 0; t->out && i < t->api->noutputs; i++) free(t->out[i]);
  free(t->out);
  free(t->in);
  free(t);
}

int krt_trainer_create(const krt_model_api *api, krt_device *dev, int64_t total_steps,
                       krt_trainer **out, char *err, size_t errlen) {
  *out = NULL;
  if (!api->train) return fail(err, errlen, "model '%s' was not compiled with --train", api->model_name);
  if (api->train->in_x < 0) return fail(err, errlen, "the step of '%s' reads no samples", api->model_name);
  krt_trainer *t = calloc(1, sizeof *t);
  if (!t) return fail(err, errlen, "%s", "out of memory");
  t->api = api, t->t = api->train, t->total = total_steps;
  krt_loss_scaler_init(&t->scaler, t->t->loss_scaling);
  t->in = calloc((size_t)api->ninputs + 1, sizeof *t->in);
  t->out = calloc((size_t)api->noutputs + 1, sizeof *t->out);
  if (!t->in || !t->out) goto oom;
  for (int i = 0; i < api->noutputs; i++)
    if (!(t->out[i] = malloc(io_bytes(&api->outputs[i]) + 1))) goto oom;
  const krt_train_info *ti = t->t;
  t->in[ti->in_lr] = &t->scalars[0], t->in[ti->in_bias1] = &t->scalars[1];
  t->in[ti->in_bias2] = &t->scalars[2], t->in[ti->in_scale] = &t->scalars[3];
  t->in[ti->in_apply] = &t->scalars[4];
  t->scalars[5] = 1.0f, t->ranks = 1;
  if (ti->in_world >= 0) t->in[ti->in_world] = &t->scalars[5];
  if (api->create(dev, &t->model, err, errlen)) {
    krt_trainer_destroy(t);
    return -1;
  }
  *out = t;
  return 0;
oom:
  krt_trainer_destroy(t);
  return fail(err, errlen, "%s", "out of memory");
}

static float out_scalar(const krt_trainer *t, int i) {
  float v;
  memcpy(&v, t->out[i], sizeof v);
  return v;
}

/* One run of the step: the schedule's rate at this step, the bias
 * corrections for the next update, the scale. */
static int run(krt_trainer *t, const void *x, const void *labels, int apply, int inject_inf,
               char *err, size_t errlen) {
  const krt_train_info *ti = t->t;
  t->in[ti->in_x] = x;
  if (ti->in_labels >= 0) t->in[ti->in_labels] = labels;
  t->scalars[0] = (float)krt_schedule_lr(ti, t->step, t->total);
  t->scalars[1] = (float)krt_bias_correction(ti->beta1, t->updates);
  t->scalars[2] = (float)krt_bias_correction(ti->beta2, t->updates);
  t->scalars[3] = inject_inf ? INFINITY : (float)t->scaler.scale;
  t->scalars[4] = apply ? 1.0f : 0.0f;
  return t->api->run(t->model, t->in, t->out, err, errlen);
}

int krt_trainer_step(krt_trainer *t, const void *x, const void *labels, int inject_inf,
                     float *loss, int *applied, char *err, size_t errlen) {
  if (run(t, x, labels, 1, inject_inf, err, errlen)) return -1;
  int ok = out_scalar(t, t->t->out_ok) != 0;
  krt_loss_scaler_update(&t->scaler, ok);
  t->updates += ok;
  t->step++;
  if (loss) *loss = out_scalar(t, t->t->out_loss);
  if (applied) *applied = ok;
  return 0;
}

int krt_trainer_eval(krt_trainer *t, const void *x, const void *labels, float *loss,
                     void *logits, char *err, size_t errlen) {
  if (run(t, x, labels, 0, 0, err, errlen)) return -1;
  if (loss) *loss = out_scalar(t, t->t->out_loss);
  if (logits && t->t->out_logits >= 0)
    memcpy(logits, t->out[t->t->out_logits], io_bytes(&t->api->outputs[t->t->out_logits]));
  return 0;
}

int64_t krt_trainer_step_count(const krt_trainer *t) { return t->step; }

int krt_trainer_set_ranks(krt_trainer *t, int ranks, char *err, size_t errlen) {
  if (ranks < 1) return fail(err, errlen, "%s", "the rank count must be at least 1");
  if (ranks > 1 && t->t->in_world < 0)
    return fail(err, errlen, "step '%s' was compiled without --data-parallel: it cannot sum its gradients "
                "over ranks (recompile with --data-parallel)", t->api->model_name);
  t->ranks = ranks, t->scalars[5] = (float)ranks;
  return 0;
}

int krt_trainer_broadcast(krt_trainer *t, krt_comm *comm, int root, char *err, size_t errlen) {
  const krt_train_info *ti = t->t;
  for (int i = 0; i < ti->nstates; i++) {
    size_t bytes = io_bytes(&ti->states[i]);
    void *buf = malloc(bytes + 1);
    if (!buf) return fail(err, errlen, "%s", "out of memory");
    int rc = (krt_comm_rank(comm) == root && t->api->read_state(t->model, i, buf, err, errlen)) ||
             krt_comm_broadcast(comm, buf, bytes, root, err, errlen) ||
             t->api->write_state(t->model, i, buf, err, errlen);
    free(buf);
    if (rc) return -1;
  }
  return 0;
}
double krt_trainer_loss_scale(const krt_trainer *t) { return t->scaler.scale; }

static int state_index(const krt_trainer *t, const char *name) {
  for (int i = 0; i < t->t->nstates; i++)
    if (!strcmp(t->t->states[i].name, name)) return i;
  return -1;
}

int krt_trainer_read(krt_trainer *t, const char *name, void *host, char *err, size_t errlen) {
  int i = state_index(t, name);
  if (i < 0) return fail(err, errlen, "the step has no param or state '%s'", name);
  return t->api->read_state(t->model, i, host, err, errlen);
}

int krt_trainer_write(krt_trainer *t, const char *name, const void *host, char *err,
                      size_t errlen) {
  int i = state_index(t, name);
  if (i < 0) return fail(err, errlen, "the step has no param or state '%s'", name);
  return t->api->write_state(t->model, i, host, err, errlen);
}

/* ---- checkpoints ------------------------------------------------------------ */
static const char *const META[] = {"kiln.step", "kiln.loss_scale", "kiln.good_steps",
                                   "kiln.data_epoch", "kiln.data_batch", "kiln.seed",
                                   "kiln.updates"};
enum { NMETA = 7 };
/* written only by a run of more than one rank: a checkpoint without it is
 * of one */
static const char RANKS_META[] = "kiln.ranks";

int krt_trainer_save(krt_trainer *t, const char *path, int64_t data_epoch, int64_t data_batch,
                     uint64_t seed, char *err, size_t errlen) {
  const krt_train_info *ti = t->t;
  krt_tensor_set set = {calloc((size_t)(ti->nstates + NMETA + 1), sizeof(krt_named_tensor)), 0};
  if (!set.items) return fail(err, errlen, "%s", "out of memory");
  int rc = -1;
  for (int i = 0; i < ti->nstates; i++) {
    const krt_io_desc *d = &ti->states[i];
    krt_named_tensor *nt = &set.items[set.count++];
    nt->name = strdup(d->name);
    nt->tensor = (krt_tensor){.dtype = d->dtype, .rank = d->rank};
    memcpy(nt->tensor.dims, d->dims, sizeof d->dims);
    nt->tensor.data = malloc(io_bytes(d) + 1);
    if (!nt->name || !nt->tensor.data) {
      fail(err, errlen, "%s", "out of memory");
      goto done;
    }
    if (t->api->read_state(t->model, i, nt->tensor.data, err, errlen)) goto done;
  }
  /* doubles hold every count a run reaches exactly (below 2^53) */
  double meta[NMETA + 1] = {(double)t->step, t->scaler.scale, (double)t->scaler.good_steps,
                            (double)data_epoch, (double)data_batch, (double)seed, (double)t->updates,
                            (double)t->ranks};
  for (int i = 0; i < NMETA + (t->ranks > 1); i++) {
    krt_named_tensor *nt = &set.items[set.count++];
    nt->name = strdup(i < NMETA ? META[i] : RANKS_META);
    nt->tensor = (krt_tensor){.dtype = KRT_F64, .rank = 1, .dims = {1}};
    nt->tensor.data = malloc(sizeof(double));
    if (!nt->name || !nt->tensor.data) {
      fail(err, errlen, "%s", "out of memory");
      goto done;
    }
    memcpy(nt->tensor.data, &meta[i], sizeof(double));
  }
  /* written beside and renamed over: a run killed while saving leaves the
   * last checkpoint whole */
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.partial", path);
  rc = krt_safetensors_write(tmp, &set, err, errlen);
  if (!rc && rename(tmp, path)) {
    if (err && errlen) snprintf(err, errlen, "cannot rename %s to %s", tmp, path);
    remove(tmp);
    rc = -1;
  }
done:
  krt_tensor_set_free(&set);
  return rc;
}

int krt_trainer_load(krt_trainer *t, const char *path, int64_t *data_epoch,
                     int64_t *data_batch, uint64_t *seed, char *err, size_t errlen) {
  const krt_train_info *ti = t->t;
  krt_tensor_set set = {0};
  if (krt_safetensors_read(path, &set, err, errlen)) return -1;
  int rc = -1;
  double meta[NMETA];
  for (int i = 0; i < NMETA; i++) {
    const krt_tensor *x = krt_tensor_set_find(&set, META[i]);
    if (!x || x->dtype != KRT_F64 || krt_tensor_numel(x) != 1) {
      if (err && errlen) snprintf(err, errlen, "%s: no '%s': not a kiln training checkpoint", path, META[i]);
      goto done;
    }
    memcpy(&meta[i], x->data, sizeof(double));
  }
  const krt_tensor *r = krt_tensor_set_find(&set, RANKS_META);
  double ranks = 1;
  if (r && r->dtype == KRT_F64 && krt_tensor_numel(r) == 1) memcpy(&ranks, r->data, sizeof ranks);
  if (ranks != (double)t->ranks) {
    if (err && errlen)
      snprintf(err, errlen, "%s was made by a run of %g rank%s; resume it on as many (mpirun -np %g), "
               "not %d", path, ranks, ranks == 1 ? "" : "s", ranks, t->ranks);
    goto done;
  }
  for (int i = 0; i < ti->nstates; i++) {
    const krt_io_desc *d = &ti->states[i];
    const krt_tensor *x = krt_tensor_set_find(&set, d->name);
    if (!x || x->dtype != d->dtype || x->rank != d->rank ||
        memcmp(x->dims, d->dims, sizeof(int64_t) * (size_t)d->rank)) {
      if (err && errlen)
        snprintf(err, errlen, "%s: %s '%s' of this step (a checkpoint of another model or compile?)",
                 path, x ? "another shape or dtype for" : "no tensor", d->name);
      goto done;
    }
    if (t->api->write_state(t->model, i, x->data, err, errlen)) goto done;
  }
  t->step = (int64_t)meta[0];
  t->scaler.scale = meta[1];
  t->scaler.good_steps = (int64_t)meta[2];
  t->updates = (int64_t)meta[6];
  if (data_epoch) *data_epoch = (int64_t)meta[3];
  if (data_batch) *data_batch = (int64_t)meta[4];
  if (seed) *seed = (uint64_t)meta[5];
  rc = 0;
done:
  krt_tensor_set_free(&set);
  return rc;
}
