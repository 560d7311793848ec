/* train_main.c - the training program of a step compiled with --train
 * (kiln compile --train --emit=exe, kiln train): batches from .npy files
 * through the input pipeline (data_loader.c), the learning rate and the
 * loss scale computed on the host each step, the compiled step run on a
 * device, progress on stderr, checkpoints, and test accuracy at the end. */
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kilnrt.h"

enum { EXIT_USAGE = 2 };
enum { OPT_DATA = 1000, OPT_EPOCHS, OPT_STEPS, OPT_BATCH, OPT_CHECKPOINT, OPT_CHECKPOINT_EVERY,
       OPT_RESUME, OPT_DEVICE, OPT_SEED, OPT_LOG_EVERY, OPT_INJECT_INF, OPT_LOSSES, OPT_STOP_AFTER };

typedef struct {
  const char *prog, *data, *checkpoint, *resume, *losses;
  long epochs, steps, batch, checkpoint_every, log_every, inject_inf, stop_after;
  unsigned long long seed;
  krt_device_kind device;
} train_opts;

static void usage(FILE *f, const char *prog, const krt_model_api *api) {
  fprintf(f, "usage: %s --data DIR (--epochs N | --steps N) [--batch B] [--checkpoint FILE]\n"
             "       [--checkpoint-every N] [--resume FILE] [--device auto|host|cuda] [--seed S]\n"
             "Train model '%s' (%s): each step runs forward, backward and the update,\n"
             "compiled ahead of time.\n"
             "  --data DIR            train_x.npy and train_y.npy (samples, labels); with\n"
             "                        test_x.npy and test_y.npy the last line gives the\n"
             "                        test accuracy\n"
             "  --epochs N            passes over the training set (batches of B, the\n"
             "                        last partial batch of each epoch dropped)\n"
             "  --steps N             or this many steps\n"
             "  --batch B             must be the batch size the step was compiled for\n"
             "                        (kiln compile --dim B=...); the default\n"
             "  --checkpoint FILE     save params, optimizer state, loss scale, step and\n"
             "                        the data order's position (.safetensors) at the end\n"
             "  --checkpoint-every N  ... and every N steps\n"
             "  --resume FILE         continue a checkpointed run exactly\n"
             "  --seed S              the data order's seed (default 0)\n"
             "  --log-every N         a progress line every N steps when stderr is not a\n"
             "                        terminal (default: 10 per run)\n"
             "  --losses FILE         write every step's loss, one per line (%%.9g)\n"
             "  --inject-inf STEP     test hook: make step STEP's gradients infinite\n"
             "  --stop-after N        test hook: stop after step N as if killed there\n"
             "                        (after its checkpoint, without the end's)\n"
             "  --device DEV          auto (default), host or cuda\n",
          prog, api->model_name, api->train ? api->train->optimizer : "?");
}

static int parse_long(const char *prog, const char *opt, const char *arg, long min, long *out) {
  char *end;
  long v = strtol(arg, &end, 10);
  if (*arg == 0 || *end || v < min) {
    fprintf(stderr, "%s: %s needs an integer >= %ld, got '%s'\n", prog, opt, min, arg);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_args(train_opts *o, const krt_model_api *api, int argc, char **argv) {
  static const struct option longopts[] = {
      {"data", required_argument, NULL, OPT_DATA},
      {"epochs", required_argument, NULL, OPT_EPOCHS},
      {"steps", required_argument, NULL, OPT_STEPS},
      {"batch", required_argument, NULL, OPT_BATCH},
      {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
      {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
      {"resume", required_argument, NULL, OPT_RESUME},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"seed", required_argument, NULL, OPT_SEED},
      {"log-every", required_argument, NULL, OPT_LOG_EVERY},
      {"inject-inf", required_argument, NULL, OPT_INJECT_INF},
      {"losses", required_argument, NULL, OPT_LOSSES},
      {"stop-after", required_argument, NULL, OPT_STOP_AFTER},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    long v;
    switch (c) {
    case OPT_DATA: o->data = optarg; break;
    case OPT_EPOCHS: if (parse_long(o->prog, "--epochs", optarg, 1, &o->epochs)) return -1; break;
    case OPT_STEPS: if (parse_long(o->prog, "--steps", optarg, 1, &o->steps)) return -1; break;
    case OPT_BATCH: if (parse_long(o->prog, "--batch", optarg, 1, &o->batch)) return -1; break;
    case OPT_CHECKPOINT: o->checkpoint = optarg; break;
    case OPT_CHECKPOINT_EVERY:
      if (parse_long(o->prog, "--checkpoint-every", optarg, 1, &o->checkpoint_every)) return -1;
      break;
    case OPT_RESUME: o->resume = optarg; break;
    case OPT_LOSSES: o->losses = optarg; break;
    case OPT_SEED:
      if (parse_long(o->prog, "--seed", optarg, 0, &v)) return -1;
      o->seed = (unsigned long long)v;
      break;
    case OPT_LOG_EVERY: if (parse_long(o->prog, "--log-every", optarg, 1, &o->log_every)) return -1; break;
    case OPT_STOP_AFTER: if (parse_long(o->prog, "--stop-after", optarg, 1, &o->stop_after)) return -1; break;
    case OPT_INJECT_INF: if (parse_long(o->prog, "--inject-inf", optarg, 0, &o->inject_inf)) return -1; break;
    case OPT_DEVICE:
      if (krt_device_kind_parse(optarg, &o->device)) {
        fprintf(stderr, "%s: --device must be auto, host or cuda, got '%s'\n", o->prog, optarg);
        return -1;
      }
      break;
    case 'h': usage(stdout, o->prog, api); exit(0);
    default:
      fprintf(stderr, "%s: unknown option '%s'\n", o->prog, argv[optind - 1]);
      usage(stderr, o->prog, api);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", o->prog, argv[optind]);
    return -1;
  }
  if (!o->data) {
    fprintf(stderr, "%s: --data DIR is required (train_x.npy, train_y.npy)\n", o->prog);
    return -1;
  }
  if (!o->epochs == !o->steps) {
    fprintf(stderr, "%s: give one of --epochs N and --steps N\n", o->prog);
    return -1;
  }
  return 0;
}

/* What one run holds. */
typedef struct {
  const train_opts *o;
  const krt_model_api *api;
  const krt_train_info *t;
  krt_device *dev;
  void *model;
  void **in, **out;       /* host buffers per input and output */
  float scalars[5];       /* lr, bias1, bias2, scale, apply */
  int64_t batch;          /* samples per step (the compiled batch) */
  size_t x_bytes, y_bytes; /* per batch */
  krt_loss_scaler scaler;
  int64_t step, total, updates; /* steps run, of the run, updates applied */
  char msg[1024];
} trainer;

static size_t io_bytes(const krt_io_desc *d) {
  size_t n = krt_dtype_size(d->dtype);
  for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];
  return n;
}

static void path_in(char *buf, size_t len, const char *dir, const char *file) {
  snprintf(buf, len, "%s/%s", dir, file);
}

/* ---- checkpoints: one .safetensors with the state and where the run is */
static const char *const META[] = {"kiln.step", "kiln.loss_scale", "kiln.good_steps",
                                   "kiln.data_epoch", "kiln.data_batch", "kiln.seed",
                                   "kiln.updates"};
enum { NMETA = 7 };

static int save_checkpoint(trainer *tr, krt_loader *loader, const char *path) {
  const krt_train_info *t = tr->t;
  krt_tensor_set set = {calloc((size_t)(t->nstates + NMETA), sizeof(krt_named_tensor)), 0};
  if (!set.items) return -1;
  int rc = -1;
  for (int i = 0; i < t->nstates; i++) {
    const krt_io_desc *d = &t->states[i];
    krt_named_tensor *nt = &set.items[set.count++];
    nt->name = strdup(d->name);
    nt->tensor = (krt_tensor){.dtype = d->dtype, .rank = d->rank};
    memcpy(nt->tensor.dims, d->dims, sizeof d->dims);
    nt->tensor.data = malloc(io_bytes(d) + 1);
    if (!nt->name || !nt->tensor.data) goto done;
    if (tr->api->read_state(tr->model, i, nt->tensor.data, tr->msg, sizeof tr->msg)) goto done;
  }
  int64_t epoch = 0, index = 0;
  krt_loader_position(loader, &epoch, &index);
  double meta[NMETA] = {(double)tr->step, tr->scaler.scale, (double)tr->scaler.good_steps,
                        (double)epoch, (double)index, (double)tr->o->seed, (double)tr->updates};
  for (int i = 0; i < NMETA; i++) {
    krt_named_tensor *nt = &set.items[set.count++];
    nt->name = strdup(META[i]);
    nt->tensor = (krt_tensor){.dtype = KRT_F64, .rank = 1, .dims = {1}};
    nt->tensor.data = malloc(sizeof(double));
    if (!nt->name || !nt->tensor.data) goto done;
    memcpy(nt->tensor.data, &meta[i], sizeof(double));
  }
  rc = krt_safetensors_write(path, &set, tr->msg, sizeof tr->msg);
done:
  krt_tensor_set_free(&set);
  return rc;
}

static int load_checkpoint(trainer *tr, krt_loader *loader, const char *path) {
  const krt_train_info *t = tr->t;
  krt_tensor_set set = {0};
  if (krt_safetensors_read(path, &set, tr->msg, sizeof tr->msg)) return -1;
  int rc = -1;
  for (int i = 0; i < t->nstates; i++) {
    const krt_io_desc *d = &t->states[i];
    const krt_tensor *x = krt_tensor_set_find(&set, d->name);
    bool same = x && x->dtype == d->dtype && x->rank == d->rank &&
                !memcmp(x->dims, d->dims, sizeof(int64_t) * (size_t)d->rank);
    if (!same) {
      snprintf(tr->msg, sizeof tr->msg, "%s: %s '%s' of this model (%s)", path,
               x ? "a different shape or dtype for" : "no tensor", d->name,
               "a checkpoint of another model or compile?");
      goto done;
    }
    if (tr->api->write_state(tr->model, i, x->data, tr->msg, sizeof tr->msg)) goto done;
  }
  double meta[NMETA];
  for (int i = 0; i < NMETA; i++) {
    const krt_tensor *x = krt_tensor_set_find(&set, META[i]);
    if (!x || x->dtype != KRT_F64 || krt_tensor_numel(x) != 1) {
      snprintf(tr->msg, sizeof tr->msg, "%s: no '%s' (not a kiln training checkpoint)", path, META[i]);
      goto done;
    }
    memcpy(&meta[i], x->data, sizeof(double));
  }
  if ((unsigned long long)meta[5] != tr->o->seed) {
    snprintf(tr->msg, sizeof tr->msg, "%s was made with --seed %.0f; resume with the same seed",
             path, meta[5]);
    goto done;
  }
  tr->step = (int64_t)meta[0];
  tr->scaler.scale = meta[1];
  tr->scaler.good_steps = (int64_t)meta[2];
  tr->updates = (int64_t)meta[6];
  rc = krt_loader_seek(loader, (int64_t)meta[3], (int64_t)meta[4], tr->msg, sizeof tr->msg);
done:
  krt_tensor_set_free(&set);
  return rc;
}

/* ---- the steps ----------------------------------------------------------- */
static int run_step(trainer *tr, const void *x, const void *y, bool apply, bool inject_inf) {
  const krt_train_info *t = tr->t;
  tr->in[t->in_x] = (void *)x;
  if (t->in_labels >= 0) tr->in[t->in_labels] = (void *)y;
  tr->scalars[0] = (float)krt_schedule_lr(t, tr->step, tr->total);
  tr->scalars[1] = (float)krt_bias_correction(t->beta1, tr->updates);
  tr->scalars[2] = (float)krt_bias_correction(t->beta2, tr->updates);
  tr->scalars[3] = inject_inf ? INFINITY : (float)tr->scaler.scale;
  tr->scalars[4] = apply ? 1.0f : 0.0f;
  return tr->api->run(tr->model, (const void *const *)tr->in, tr->out, tr->msg, sizeof tr->msg);
}

static float out_scalar(const trainer *tr, int i) {
  float v;
  memcpy(&v, tr->out[i], sizeof v);
  return v;
}

/* Test accuracy: every test batch evaluated with apply = 0 (the state is
 * left as it is); a short last batch is padded and only its samples
 * count. */
static int evaluate(trainer *tr, double *accuracy) {
  const krt_train_info *t = tr->t;
  char xp[4200], yp[4200];
  path_in(xp, sizeof xp, tr->o->data, "test_x.npy");
  path_in(yp, sizeof yp, tr->o->data, "test_y.npy");
  if (access(xp, R_OK) || access(yp, R_OK) || t->out_logits < 0 || t->in_labels < 0) return 1;
  const krt_io_desc *xd = &tr->api->inputs[t->in_x], *yd = &tr->api->inputs[t->in_labels];
  const krt_io_desc *ld = &tr->api->outputs[t->out_logits];
  krt_loader_config cfg = {.x_path = xp, .y_path = yp, .batch = (int)tr->batch, .shuffle = 0,
                           .drop_last = 0, .x_dtype = xd->dtype, .y_dtype = yd->dtype};
  krt_loader *l = NULL;
  if (krt_loader_open(&cfg, &l, tr->msg, sizeof tr->msg)) return -1;
  int64_t n = krt_loader_samples(l), seen = 0, correct = 0;
  int64_t classes = ld->dims[ld->rank - 1];
  unsigned char *xb = calloc(1, tr->x_bytes + 1), *yb = calloc(1, tr->y_bytes + 1);
  int rc = -1;
  if (!xb || !yb) goto done;
  while (seen < n) {
    const void *x, *y;
    int count;
    double wait;
    if (krt_loader_next(l, &x, &y, &count, &wait, tr->msg, sizeof tr->msg)) goto done;
    memset(xb, 0, tr->x_bytes);
    memset(yb, 0, tr->y_bytes);
    memcpy(xb, x, tr->x_bytes / (size_t)tr->batch * (size_t)count);
    memcpy(yb, y, tr->y_bytes / (size_t)tr->batch * (size_t)count);
    if (run_step(tr, xb, yb, false, false)) goto done;
    const float *logits = tr->out[t->out_logits];
    for (int b = 0; b < count; b++) {
      int64_t best = 0;
      for (int64_t k = 1; k < classes; k++)
        if (logits[b * classes + k] > logits[b * classes + best]) best = k;
      int64_t label = yd->dtype == KRT_I32 ? ((const int32_t *)yb)[b] : ((const int64_t *)yb)[b];
      correct += best == label;
    }
    seen += count;
  }
  *accuracy = n ? (double)correct / (double)n : 0;
  rc = 0;
done:
  free(xb);
  free(yb);
  krt_loader_close(l);
  return rc;
}

static void progress(const trainer *tr, bool tty, int64_t total, double loss, double samples_s,
                     double wait_ms, bool last) {
  if (tty)
    fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f samples/s  input wait %.2f ms  scale %g%s",
            (long long)tr->step, (long long)total, loss, samples_s, wait_ms, tr->scaler.scale,
            last ? "\n" : "");
  else
    fprintf(stderr, "step %lld/%lld loss %.6f samples/s %.0f input_wait_ms %.3f loss_scale %g\n",
            (long long)tr->step, (long long)total, loss, samples_s, wait_ms, tr->scaler.scale);
}

int krt_train_main(const krt_model_api *api, int argc, char **argv) {
  const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
  train_opts o = {.prog = argc > 0 ? (slash ? slash + 1 : argv[0]) : api->model_name,
                  .device = KRT_DEVICE_AUTO, .inject_inf = -1};
  if (!api->train) {
    fprintf(stderr, "%s: model '%s' was not compiled with --train\n", o.prog, api->model_name);
    return EXIT_USAGE;
  }
  if (parse_args(&o, api, argc, argv)) return EXIT_USAGE;
  const krt_train_info *t = api->train;
  trainer tr = {.o = &o, .api = api, .t = t};
  if (t->in_x < 0) {
    fprintf(stderr, "%s: the step reads no samples input\n", o.prog);
    return 1;
  }
  const krt_io_desc *xd = &api->inputs[t->in_x];
  tr.batch = xd->rank ? xd->dims[0] : 1;
  if (o.batch && o.batch != tr.batch) {
    fprintf(stderr, "%s: --batch %ld: the step was compiled for batches of %lld "
                    "(recompile with --dim B=%ld)\n", o.prog, o.batch, (long long)tr.batch, o.batch);
    return EXIT_USAGE;
  }
  tr.x_bytes = io_bytes(xd);
  tr.y_bytes = t->in_labels >= 0 ? io_bytes(&api->inputs[t->in_labels]) : 0;
  krt_loss_scaler_init(&tr.scaler, t->loss_scaling);
  int rc = 1;
  krt_loader *loader = NULL;
  FILE *losses = NULL;
  tr.in = calloc((size_t)api->ninputs + 1, sizeof *tr.in);
  tr.out = calloc((size_t)api->noutputs + 1, sizeof *tr.out);
  if (!tr.in || !tr.out) goto done;
  tr.in[t->in_lr] = &tr.scalars[0], tr.in[t->in_bias1] = &tr.scalars[1];
  tr.in[t->in_bias2] = &tr.scalars[2], tr.in[t->in_scale] = &tr.scalars[3];
  tr.in[t->in_apply] = &tr.scalars[4];
  for (int i = 0; i < api->noutputs; i++)
    if (!(tr.out[i] = malloc(io_bytes(&api->outputs[i]) + 1))) goto done;
  char xp[4200], yp[4200];
  path_in(xp, sizeof xp, o.data, "train_x.npy");
  path_in(yp, sizeof yp, o.data, "train_y.npy");
  krt_loader_config cfg = {.x_path = xp, .y_path = yp, .batch = (int)tr.batch, .seed = o.seed,
                           .shuffle = 1, .drop_last = 1, .x_dtype = xd->dtype,
                           .y_dtype = t->in_labels >= 0 ? api->inputs[t->in_labels].dtype : KRT_I64};
  if (krt_loader_open(&cfg, &loader, tr.msg, sizeof tr.msg)) goto fail;
  int64_t per_epoch = krt_loader_samples(loader) / tr.batch;
  if (per_epoch < 1) {
    snprintf(tr.msg, sizeof tr.msg, "%.900s holds %lld samples, fewer than one batch of %lld", xp,
             (long long)krt_loader_samples(loader), (long long)tr.batch);
    goto fail;
  }
  int64_t total = o.steps ? o.steps : o.epochs * per_epoch;
  tr.total = total;
  if (krt_device_open(o.device, &tr.dev, tr.msg, sizeof tr.msg) ||
      api->create(tr.dev, &tr.model, tr.msg, sizeof tr.msg))
    goto fail;
  if (o.resume && load_checkpoint(&tr, loader, o.resume)) goto fail;
  if (o.losses && !(losses = fopen(o.losses, o.resume ? "a" : "w"))) {
    snprintf(tr.msg, sizeof tr.msg, "cannot write %s", o.losses);
    goto fail;
  }
  bool tty = isatty(2);
  long log_every = o.log_every ? o.log_every : (total >= 10 ? total / 10 : 1);
  fprintf(stderr, "training '%s' on %s: %lld steps of %lld samples, %s%s\n", api->model_name,
          krt_device_name(tr.dev), (long long)total, (long long)tr.batch, t->optimizer,
          t->loss_scaling ? ", dynamic loss scaling" : "");
  double loss = NAN, t0 = krt_now_ms(), wait_total = 0, window_wait = 0;
  int64_t skipped = 0, window_start = tr.step;
  double window_t0 = t0;
  while (tr.step < total) {
    const void *x, *y;
    int count;
    double wait;
    if (krt_loader_next(loader, &x, &y, &count, &wait, tr.msg, sizeof tr.msg)) goto fail;
    wait_total += wait, window_wait += wait;
    if (run_step(&tr, x, y, true, tr.step == o.inject_inf)) goto fail;
    loss = out_scalar(&tr, t->out_loss);
    bool ok = out_scalar(&tr, t->out_ok) != 0;
    skipped += !ok;
    tr.updates += ok;
    if (krt_loss_scaler_update(&tr.scaler, ok) || !ok)
      if (!tty && !ok)
        fprintf(stderr, "step %lld: gradients not finite: update skipped, loss scale now %g\n",
                (long long)tr.step, tr.scaler.scale);
    if (losses) fprintf(losses, "%.9g\n", loss);
    tr.step++;
    bool last = tr.step == total;
    if (tty || tr.step % log_every == 0 || last) {
      double dt = (krt_now_ms() - window_t0) / 1e3;
      int64_t steps = tr.step - window_start;
      if (tty || dt > 0) progress(&tr, tty, total, loss, dt > 0 ? (double)(steps * tr.batch) / dt : 0,
                                  steps ? window_wait / (double)steps : 0, last);
      window_t0 = krt_now_ms(), window_start = tr.step, window_wait = 0;
    }
    if (o.checkpoint && o.checkpoint_every && tr.step % o.checkpoint_every == 0 && !last &&
        save_checkpoint(&tr, loader, o.checkpoint))
      goto fail;
    if (o.stop_after && tr.step == o.stop_after && !last) {
      fprintf(stderr, "stopped after step %lld (--stop-after)\n", (long long)tr.step);
      rc = 0;
      goto done;
    }
  }
  if (o.checkpoint && save_checkpoint(&tr, loader, o.checkpoint)) goto fail;
  double secs = (krt_now_ms() - t0) / 1e3;
  /* the split of the steps' time: waiting for input, and the rest */
  fprintf(stderr, "%.2f s: compute %.2f s, input wait %.1f ms (%.2f%%); %lld step%s skipped\n", secs,
          secs - wait_total / 1e3, wait_total, secs > 0 ? wait_total / 10 / secs : 0,
          (long long)skipped, skipped == 1 ? "" : "s");
  double accuracy;
  int ev = evaluate(&tr, &accuracy);
  if (ev < 0) goto fail;
  printf("final: step=%lld loss=%.6f", (long long)tr.step, loss);
  if (ev == 0) printf(" accuracy=%.4f", accuracy);
  printf("\n");
  rc = 0;
  goto done;
fail:
  fprintf(stderr, "%s: error: %s\n", o.prog, tr.msg);
done:
  if (losses) fclose(losses);
  if (tr.model) api->destroy(tr.model);
  krt_device_close(tr.dev);
  krt_loader_close(loader);
  for (int i = 0; tr.out && i < api->noutputs; i++) free(tr.out[i]);
  free(tr.in);
  free(tr.out);
  return rc;
}
