/* timing.c - the clock and the median that every timed run reports. */
#include <stdlib.h>
#include <time.h>

#include "kilnrt.h"

double krt_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double krt_median(double *values, size_t n) {
  if (n == 0) return 0;
  qsort(values, n, sizeof *values, by_value);
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}
