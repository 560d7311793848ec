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
       OPT_RESUME, OPT_DEVICE, OPT_SEED, OPT_LOG_EVERY, OPT_INJECT_INF, OPT_LOSSES, OPT_STOP_AFTER,
       OPT_INJECT_RANK, OPT_TIMEOUT };

typedef struct {
  const char *prog, *data, *checkpoint, *resume, *losses;
  long epochs, steps, batch, checkpoint_every, log_every, inject_inf, stop_after, inject_rank;
  double timeout_s;
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
             "  --inject-inf-rank R   ... on rank R alone (data-parallel; default: every rank)\n"
             "  --timeout S           data-parallel: a collective not done within S seconds\n"
             "                        (a rank lost or stalled) ends every rank (default 300)\n"
             "  --stop-after N        test hook: stop after step N as if killed there\n"
             "                        (after its checkpoint, without the end's)\n"
             "  --device DEV          auto (default), host or cuda\n"
             "Data-parallel (a step compiled with --data-parallel): mpirun -np N %s ...;\n"
             "--batch is then each rank's share of a global batch of N times as many.\n",
          prog, api->model_name, api->train ? api->train->optimizer : "?", prog);
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
      {"inject-inf-rank", required_argument, NULL, OPT_INJECT_RANK},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
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
    case OPT_INJECT_RANK:
      if (parse_long(o->prog, "--inject-inf-rank", optarg, 0, &o->inject_rank)) return -1;
      break;
    case OPT_TIMEOUT:
      if (parse_long(o->prog, "--timeout", optarg, 1, &v)) return -1;
      o->timeout_s = (double)v;
      break;
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

static size_t io_bytes(const krt_io_desc *d) {
  size_t n = krt_dtype_size(d->dtype);
  for (int i = 0; i < d->rank; i++) n *= (size_t)d->dims[i];
  return n;
}

static void path_in(char *buf, size_t len, const char *dir, const char *file) {
  snprintf(buf, len, "%s/%s", dir, file);
}

/* The files' samples must be what the step takes: a batch input is
 * [batch, sample dims..]; -1 with a message naming the file otherwise. */
static int check_samples(const krt_loader *l, const krt_io_desc *x, const krt_io_desc *y,
                         char *msg, size_t msglen) {
  krt_io_desc fx, fy;
  krt_loader_sample_desc(l, &fx, &fy);
  const krt_io_desc *want[2] = {x, y}, *got[2] = {&fx, &fy};
  for (int k = 0; k < 2; k++) {
    const krt_io_desc *w = want[k], *f = got[k];
    if (!w) continue;
    bool same = w->rank == f->rank + 1;
    for (int d = 0; same && d < f->rank; d++) same = w->dims[d + 1] == f->dims[d];
    if (same) continue;
    size_t n = (size_t)snprintf(msg, msglen, "%.900s holds samples of shape [", f->name);
    for (int d = 0; d < f->rank && n < msglen; d++)
      n += (size_t)snprintf(msg + n, msglen - n, "%s%lld", d ? ", " : "", (long long)f->dims[d]);
    if (n < msglen) n += (size_t)snprintf(msg + n, msglen - n, "], but input '%s' takes [", w->name);
    for (int d = 1; d < w->rank && n < msglen; d++)
      n += (size_t)snprintf(msg + n, msglen - n, "%s%lld", d > 1 ? ", " : "", (long long)w->dims[d]);
    if (n < msglen) snprintf(msg + n, msglen - n, "] per sample");
    return -1;
  }
  return 0;
}

/* Test accuracy: every test batch evaluated (nothing updated); a short
 * last batch is padded and only its samples count.  1 when there is no
 * test set (or nothing to take an argmax of). */
static int evaluate(const train_opts *o, const krt_model_api *api, krt_trainer *tr, int64_t batch,
                    double *accuracy, char *msg, size_t msglen) {
  const krt_train_info *t = api->train;
  char xp[4200], yp[4200];
  path_in(xp, sizeof xp, o->data, "test_x.npy");
  path_in(yp, sizeof yp, o->data, "test_y.npy");
  if (access(xp, R_OK) || access(yp, R_OK) || t->out_logits < 0 || t->in_labels < 0) return 1;
  const krt_io_desc *xd = &api->inputs[t->in_x], *yd = &api->inputs[t->in_labels];
  const krt_io_desc *ld = &api->outputs[t->out_logits];
  if (ld->dtype != KRT_F32) return 1;
  krt_loader_config cfg = {.x_path = xp, .y_path = yp, .batch = (int)batch, .shuffle = 0,
                           .drop_last = 0, .x_dtype = xd->dtype, .y_dtype = yd->dtype};
  krt_loader *l = NULL;
  if (krt_loader_open(&cfg, &l, msg, msglen)) return -1;
  if (check_samples(l, xd, yd, msg, msglen)) {
    krt_loader_close(l);
    return -1;
  }
  int64_t n = krt_loader_samples(l), seen = 0, correct = 0;
  int64_t classes = ld->dims[ld->rank - 1];
  size_t xb_bytes = io_bytes(xd), yb_bytes = io_bytes(yd);
  unsigned char *xb = calloc(1, xb_bytes + 1), *yb = calloc(1, yb_bytes + 1);
  float *logits = malloc(io_bytes(ld) + 1);
  int rc = -1;
  if (!xb || !yb || !logits) goto done;
  while (seen < n) {
    const void *x, *y;
    int count;
    double wait;
    if (krt_loader_next(l, &x, &y, &count, &wait, msg, msglen)) goto done;
    memset(xb, 0, xb_bytes);
    memset(yb, 0, yb_bytes);
    memcpy(xb, x, xb_bytes / (size_t)batch * (size_t)count);
    memcpy(yb, y, yb_bytes / (size_t)batch * (size_t)count);
    if (krt_trainer_eval(tr, xb, yb, NULL, logits, msg, msglen)) goto done;
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
  free(logits);
  krt_loader_close(l);
  return rc;
}

static void progress(int64_t step, int64_t total, double scale, bool tty, double loss,
                     double samples_s, double wait_ms, bool last) {
  if (tty)
    fprintf(stderr, "\rstep %lld/%lld  loss %.4f  %.0f samples/s  input wait %.2f ms  scale %g%s",
            (long long)step, (long long)total, loss, samples_s, wait_ms, scale, last ? "\n" : "");
  else
    fprintf(stderr, "step %lld/%lld loss %.6f samples/s %.0f input_wait_ms %.3f loss_scale %g\n",
            (long long)step, (long long)total, loss, samples_s, wait_ms, scale);
}

/* The ranks an MPI launcher started, from its environment (1: none). */
static int launcher_ranks(void) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && atoi(v) > 1) return atoi(v);
  }
  return 1;
}

int krt_train_main(const krt_model_api *api, int argc, char **argv) {
  return krt_train_main_with(api, argc, argv, NULL);
}

/* The global batch's mean loss and whether every rank took its update:
 * the ranks' losses summed, their skips max-reduced.  Each rank decided
 * from the same summed gradients, so a disagreement is an error. */
static int agree(krt_comm *comm, float *loss, int applied, int64_t step, char *msg, size_t msglen) {
  if (krt_comm_size(comm) == 1) return 0;
  double sum = *loss;
  int32_t skipped = !applied;
  if (krt_comm_all_reduce(comm, &sum, 1, KRT_F64, KRT_REDUCE_SUM, msg, msglen) ||
      krt_comm_all_reduce(comm, &skipped, 1, KRT_I32, KRT_REDUCE_MAX, msg, msglen))
    return -1;
  if (skipped != !applied) {
    snprintf(msg, msglen, "rank %d: step %lld: the ranks disagree whether its gradients were finite",
             krt_comm_rank(comm), (long long)step);
    return -1;
  }
  *loss = (float)(sum / krt_comm_size(comm));
  return 0;
}

int krt_train_main_with(const krt_model_api *api, int argc, char **argv, krt_comm_opener open) {
  const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
  train_opts o = {.prog = argc > 0 ? (slash ? slash + 1 : argv[0]) : api->model_name,
                  .device = KRT_DEVICE_AUTO, .inject_inf = -1, .inject_rank = -1, .timeout_s = 300};
  if (!api->train) {
    fprintf(stderr, "%s: model '%s' was not compiled with --train\n", o.prog, api->model_name);
    return EXIT_USAGE;
  }
  if (parse_args(&o, api, argc, argv)) return EXIT_USAGE;
  const krt_train_info *t = api->train;
  if (t->in_x < 0) {
    fprintf(stderr, "%s: the step reads no samples input\n", o.prog);
    return 1;
  }
  const krt_io_desc *xd = &api->inputs[t->in_x];
  int64_t batch = xd->rank ? xd->dims[0] : 1;
  if (o.batch && o.batch != batch) {
    fprintf(stderr, "%s: --batch %ld: the step was compiled for batches of %lld "
                    "(recompile with --dim B=%ld)\n", o.prog, o.batch, (long long)batch, o.batch);
    return EXIT_USAGE;
  }
  int rc = 1;
  char msg[1024];
  krt_comm *comm = NULL;
  krt_loader *loader = NULL;
  krt_device *dev = NULL;
  krt_trainer *tr = NULL;
  FILE *losses = NULL;
  if (open && open(&argc, &argv, o.timeout_s, &comm, msg, sizeof msg)) goto fail;
  int rank = krt_comm_rank(comm), ranks = krt_comm_size(comm);
  /* several copies of a one-rank program would each train alone */
  if (!comm && launcher_ranks() > 1) ranks = launcher_ranks();
  bool lead = rank == 0; /* prints progress and writes checkpoints */
  if (ranks > 1 && (t->in_world < 0 || !comm)) {
    snprintf(msg, sizeof msg, "step '%s' was compiled without --data-parallel and cannot run on %d ranks "
             "(recompile with --data-parallel)", api->model_name, ranks);
    goto fail;
  }
  char xp[4200], yp[4200];
  path_in(xp, sizeof xp, o.data, "train_x.npy");
  path_in(yp, sizeof yp, o.data, "train_y.npy");
  krt_loader_config cfg = {.x_path = xp, .y_path = yp, .batch = (int)batch, .seed = o.seed,
                           .shuffle = 1, .drop_last = 1, .x_dtype = xd->dtype,
                           .y_dtype = t->in_labels >= 0 ? api->inputs[t->in_labels].dtype : KRT_I64,
                           .rank = rank, .ranks = ranks};
  if (krt_loader_open(&cfg, &loader, msg, sizeof msg) ||
      check_samples(loader, xd, t->in_labels >= 0 ? &api->inputs[t->in_labels] : NULL, msg, sizeof msg))
    goto fail;
  int64_t global = batch * ranks, per_epoch = krt_loader_samples(loader) / global;
  if (per_epoch < 1) {
    snprintf(msg, sizeof msg, "%.900s holds %lld samples, fewer than one batch of %lld", xp,
             (long long)krt_loader_samples(loader), (long long)global);
    goto fail;
  }
  int64_t total = o.steps ? o.steps : o.epochs * per_epoch;
  if (!strcmp(t->schedule, "cosine") && t->total < 1 && (double)total <= t->warmup) {
    snprintf(msg, sizeof msg, "a cosine schedule without `total` runs over the whole run, "
                              "%lld steps, which must be more than its warmup (%g)",
             (long long)total, t->warmup);
    goto fail;
  }
  if (krt_device_open(o.device, &dev, msg, sizeof msg) ||
      krt_trainer_create(api, dev, total, &tr, msg, sizeof msg) ||
      krt_trainer_set_ranks(tr, ranks, msg, sizeof msg))
    goto fail;
  krt_device_set_comm(dev, comm);
  if (o.resume) {
    int64_t epoch, index;
    uint64_t seed;
    if (krt_trainer_load(tr, o.resume, &epoch, &index, &seed, msg, sizeof msg)) goto fail;
    if (seed != o.seed) {
      snprintf(msg, sizeof msg, "%.900s was made with --seed %llu; resume with the same seed",
               o.resume, (unsigned long long)seed);
      goto fail;
    }
    if (krt_loader_seek(loader, epoch, index, msg, sizeof msg)) goto fail;
  }
  /* every rank starts from rank 0's parameters and optimizer state */
  if (ranks > 1 && krt_trainer_broadcast(tr, comm, 0, msg, sizeof msg)) goto fail;
  if (lead && o.losses && !(losses = fopen(o.losses, o.resume ? "a" : "w"))) {
    snprintf(msg, sizeof msg, "cannot write %.900s", o.losses);
    goto fail;
  }
  bool tty = isatty(2);
  long log_every = o.log_every ? o.log_every : (total >= 10 ? total / 10 : 1);
  if (lead) {
    fprintf(stderr, "training '%s' on %s: %lld steps of %lld samples, %s%s", api->model_name,
            krt_device_name(dev), (long long)total, (long long)global, t->optimizer,
            t->loss_scaling ? ", dynamic loss scaling" : "");
    if (ranks > 1) fprintf(stderr, ", %d ranks of %lld samples each, %d gradient bucket%s", ranks,
                           (long long)batch, t->nbuckets, t->nbuckets == 1 ? "" : "s");
    fprintf(stderr, "\n");
  }
  double t0 = krt_now_ms(), wait_total = 0, window_wait = 0, window_t0 = t0;
  float loss = NAN;
  int64_t skipped = 0, window_start = krt_trainer_step_count(tr), first_step = window_start;
  while (krt_trainer_step_count(tr) < total) {
    const void *x, *y;
    int count, applied;
    double wait;
    int64_t at = krt_trainer_step_count(tr);
    krt_comm_set_step(comm, at);
    if (krt_loader_next(loader, &x, &y, &count, &wait, msg, sizeof msg)) goto fail;
    wait_total += wait, window_wait += wait;
    bool inject = at == o.inject_inf && (o.inject_rank < 0 || o.inject_rank == rank);
    if (krt_trainer_step(tr, x, y, inject, &loss, &applied, msg, sizeof msg) ||
        agree(comm, &loss, applied, at, msg, sizeof msg))
      goto fail;
    skipped += !applied;
    if (!applied && t->loss_scaling && !tty) { /* every rank says it skipped, in one line */
      char who[32] = "";
      if (ranks > 1) snprintf(who, sizeof who, "rank %d: ", rank);
      fprintf(stderr, "%sstep %lld: gradients not finite: update skipped, loss scale now %g\n", who,
              (long long)at, krt_trainer_loss_scale(tr));
    }
    if (losses) fprintf(losses, "%.9g\n", loss);
    int64_t step = at + 1;
    bool last = step == total;
    if (lead && (tty || step % log_every == 0 || last)) {
      double dt = (krt_now_ms() - window_t0) / 1e3;
      int64_t steps = step - window_start;
      progress(step, total, krt_trainer_loss_scale(tr), tty, loss,
               dt > 0 ? (double)(steps * global) / dt : 0, steps ? window_wait / (double)steps : 0, last);
      window_t0 = krt_now_ms(), window_start = step, window_wait = 0;
    }
    int64_t epoch, index;
    krt_loader_position(loader, &epoch, &index);
    if (lead && o.checkpoint && o.checkpoint_every && step % o.checkpoint_every == 0 && !last &&
        krt_trainer_save(tr, o.checkpoint, epoch, index, o.seed, msg, sizeof msg))
      goto fail;
    if (o.stop_after && step == o.stop_after && !last) {
      if (lead) fprintf(stderr, "stopped after step %lld (--stop-after)\n", (long long)step);
      rc = 0;
      goto done;
    }
  }
  int64_t epoch, index;
  krt_loader_position(loader, &epoch, &index);
  if (lead && o.checkpoint && krt_trainer_save(tr, o.checkpoint, epoch, index, o.seed, msg, sizeof msg))
    goto fail;
  double secs = (krt_now_ms() - t0) / 1e3;
  int64_t ran = krt_trainer_step_count(tr) - first_step;
  krt_comm_stats cs;
  krt_comm_get_stats(comm, &cs);
  if (lead) {
    /* the split of the steps' time: waiting for input, waiting for the
     * gradient exchange, and the rest */
    fprintf(stderr, "%.2f s: compute %.2f s, input wait %.1f ms (%.2f%%); %lld step%s skipped\n", secs,
            secs - wait_total / 1e3 - cs.exposed_ms / 1e3, wait_total, secs > 0 ? wait_total / 10 / secs : 0,
            (long long)skipped, skipped == 1 ? "" : "s");
    if (ranks > 1 && ran > 0) {
      double busy = cs.busy_ms / (double)ran, exposed = cs.exposed_ms / (double)ran;
      double hidden = busy > exposed ? busy - exposed : 0;
      fprintf(stderr, "per step over %d ranks: compute %.3f ms, all-reduce %.3f ms of which %.3f ms "
                      "(%.0f%%) hidden behind the backward pass and %.3f ms exposed, input wait %.3f ms\n",
              ranks, (secs * 1e3 - wait_total - cs.exposed_ms) / (double)ran, busy, hidden,
              busy > 0 ? 100 * hidden / busy : 0, exposed, wait_total / (double)ran);
    }
  }
  double accuracy;
  /* rank 0 alone evaluates: its runs of the step exchange nothing (they
   * update nothing), so the device leaves the other ranks out */
  krt_device_set_comm(dev, NULL);
  int ev = lead ? evaluate(&o, api, tr, batch, &accuracy, msg, sizeof msg) : 1;
  if (ev < 0) goto fail;
  if (lead) {
    printf("final: step=%lld loss=%.6f", (long long)krt_trainer_step_count(tr), loss);
    if (ev == 0) printf(" accuracy=%.4f", accuracy);
    printf("\n");
  }
  rc = 0;
  goto done;
fail:
  if (krt_comm_size(comm) > 1) fprintf(stderr, "%s: rank %d: error: %s\n", o.prog, krt_comm_rank(comm), msg);
  else fprintf(stderr, "%s: error: %s\n", o.prog, msg);
done:
  if (losses) fclose(losses);
  krt_trainer_destroy(tr);
  krt_device_close(dev);
  krt_loader_close(loader);
  /* a rank that failed ends the others rather than leave them waiting */
  if (rc && krt_comm_size(comm) > 1) {
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  krt_comm_close(comm);
  return rc;
}
