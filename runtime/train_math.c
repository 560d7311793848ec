/* train_math.c - the host's share of a training step: the loss scaler and
 * the learning-rate schedule, computed in double once per step and fed to
 * the compiled step as f32 scalars. */
#include <math.h>
#include <string.h>

#include "kilnrt.h"

void krt_loss_scaler_init(krt_loss_scaler *s, int enabled) {
  memset(s, 0, sizeof *s);
  s->enabled = enabled;
  s->scale = enabled ? 65536.0 : 1.0;
  s->growth_interval = 2000;
}

int krt_loss_scaler_update(krt_loss_scaler *s, int finite) {
  if (!s->enabled) return 0;
  if (!finite) {
    double was = s->scale;
    s->scale = s->scale / 2 < 1 ? 1 : s->scale / 2;
    s->good_steps = 0;
    return s->scale != was;
  }
  if (++s->good_steps < s->growth_interval) return 0;
  s->good_steps = 0;
  if (s->scale > 1e300) return 0; /* (finite steps at such a scale cannot happen in fp16) */
  s->scale *= 2;
  return 1;
}

double krt_bias_correction(double beta, int64_t step) {
  double d = 1 - pow(beta, (double)(step + 1));
  return d > 0 ? 1 / d : 1;
}

double krt_schedule_lr(const krt_train_info *t, int64_t step, int64_t total_steps) {
  double lr = t->lr, warmup = t->warmup;
  if (warmup >= 1 && (double)step < warmup) return lr * (double)(step + 1) / warmup;
  double s = (double)step - (warmup >= 1 ? warmup : 0);
  if (!strcmp(t->schedule, "step") && t->step_size >= 1)
    return lr * pow(t->gamma, floor(s / t->step_size));
  if (!strcmp(t->schedule, "cosine")) { /* T counts the whole run, warmup included */
    double T = t->total >= 1 ? t->total : (double)total_steps, w = warmup >= 1 ? warmup : 0;
    if (T <= w || (double)step >= T) return t->min_lr;
    return t->min_lr + (lr - t->min_lr) * 0.5 * (1 + cos(3.14159265358979323846 * s / (T - w)));
  }
  return lr;
}
