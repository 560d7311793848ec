/* trace.c - a compiled model's runs as a Chrome trace (the JSON that
 * Perfetto and chrome://tracing open: "traceEvents", complete events "X"
 * with ts and dur in microseconds), and a summary table of the steps.
 *
 * A step is what the profiler marks (profile.c): one kernel, one library
 * call with its epilogue, or a node's few kernels (args.launches says how
 * many); its event is named after its fusion group and the IR nodes in it
 * (krt_step_info.name).  Times come from the device's marks: CUDA events
 * on a GPU, the clock on the host device, where the kernels run on CPU
 * threads through the emulation (said in the trace: "emulated CPU
 * timing").  Steps are back to back between marks, so the idle time
 * between kernels is the run's time outside its steps. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kilnrt.h"

struct krt_trace {
  const krt_model_api *api;
  char device[160];
  int emulated;
  int nruns, cap;
  double *step_ms; /* nruns x api->nsteps */
  double *run_ms;  /* each run's wall time, marks to marks and outside */
};

krt_trace *krt_trace_new(const krt_model_api *api, krt_device *dev) {
  krt_trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->api = api;
  snprintf(t->device, sizeof t->device, "%s", krt_device_name(dev));
  t->emulated = krt_device_kind_of(dev) == KRT_DEVICE_HOST;
  return t;
}

int krt_trace_add_run(krt_trace *t, const double *step_ms, double run_ms) {
  int n = t->api->nsteps;
  if (t->nruns == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    double *s = realloc(t->step_ms, (size_t)cap * (size_t)(n ? n : 1) * sizeof *s);
    if (s) t->step_ms = s;
    double *r = realloc(t->run_ms, (size_t)cap * sizeof *r);
    if (r) t->run_ms = r;
    if (!s || !r) return -1;
    t->cap = cap;
  }
  if (n) memcpy(t->step_ms + (size_t)t->nruns * (size_t)n, step_ms, (size_t)n * sizeof *step_ms);
  t->run_ms[t->nruns++] = run_ms;
  return 0;
}

/* s as a JSON string */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int krt_trace_write(const krt_trace *t, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    if (err && errlen) snprintf(err, errlen, "cannot write the trace %s", path);
    return -1;
  }
  const krt_model_api *a = t->api;
  fprintf(f, "{\"displayTimeUnit\": \"ms\",\n \"otherData\": {\"model\": ");
  json_string(f, a->model_name);
  fprintf(f, ", \"device\": ");
  json_string(f, t->device);
  fprintf(f, ", \"timing\": \"%s\"},\n \"traceEvents\": [\n",
          t->emulated ? "emulated CPU timing (the host device)" : "GPU events");
  fprintf(f, "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": ");
  json_string(f, a->model_name);
  fprintf(f, "}},\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": "
             "{\"name\": \"runs\"}},\n  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, "
             "\"tid\": 2, \"args\": {\"name\": \"%s\"}}",
          t->emulated ? "kernels (emulated on the CPU)" : "kernels");
  double at = 0; /* us: runs one after another on the trace's clock */
  for (int r = 0; r < t->nruns; r++) {
    fprintf(f, ",\n  {\"name\": \"run %d\", \"cat\": \"run\", \"ph\": \"X\", \"pid\": 1, \"tid\": 1, "
               "\"ts\": %.3f, \"dur\": %.3f}", r, at, t->run_ms[r] * 1e3);
    double ts = at;
    for (int s = 0; s < a->nsteps; s++) {
      double ms = t->step_ms[(size_t)r * (size_t)a->nsteps + (size_t)s];
      fprintf(f, ",\n  {\"name\": ");
      json_string(f, a->steps[s].name);
      fprintf(f, ", \"cat\": \"kernel\", \"ph\": \"X\", \"pid\": 1, \"tid\": 2, \"ts\": %.3f, "
                 "\"dur\": %.3f, \"args\": {\"step\": %d, \"launches\": %d, \"bytes\": %zu}}",
              ts, ms * 1e3, s, a->steps[s].launches, a->steps[s].bytes);
      ts += ms * 1e3;
    }
    at += t->run_ms[r] * 1e3 + 1;
  }
  fprintf(f, "\n ]\n}\n");
  if (fclose(f)) {
    if (err && errlen) snprintf(err, errlen, "writing the trace %s failed", path);
    return -1;
  }
  return 0;
}

void krt_trace_summary(const krt_trace *t, FILE *f) {
  const krt_model_api *a = t->api;
  if (!t->nruns) return;
  double total = 0, steps = 0;
  for (int r = 0; r < t->nruns; r++) total += t->run_ms[r];
  fprintf(f, "profile of '%s' on %s%s, %d run%s:\n", a->model_name, t->device,
          t->emulated ? " (emulated CPU timing)" : "", t->nruns, t->nruns == 1 ? "" : "s");
  fprintf(f, "  %-48s %6s %10s %10s %6s %12s %8s\n", "step (kernel or library call: nodes)", "calls",
          "total ms", "mean ms", "share", "bytes", "GB/s");
  for (int s = 0; s < a->nsteps; s++) {
    double sum = 0;
    for (int r = 0; r < t->nruns; r++) sum += t->step_ms[(size_t)r * (size_t)a->nsteps + (size_t)s];
    steps += sum;
    double mean = sum / t->nruns;
    fprintf(f, "  %-48.48s %6d %10.3f %10.4f %5.1f%% %12zu %8.2f\n", a->steps[s].name,
            a->steps[s].launches * t->nruns, sum, mean, total > 0 ? 100 * sum / total : 0,
            a->steps[s].bytes, mean > 0 ? (double)a->steps[s].bytes / (mean * 1e6) : 0);
  }
  fprintf(f, "  %-48s %6s %10.3f %10.4f %5.1f%%\n", "idle between steps (copies, host work)", "",
          total - steps, (total - steps) / t->nruns, total > 0 ? 100 * (total - steps) / total : 0);
}

void krt_trace_free(krt_trace *t) {
  if (!t) return;
  free(t->step_ms);
  free(t->run_ms);
  free(t);
}
