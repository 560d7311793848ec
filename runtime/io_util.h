/* io_util.h - file handling shared by the tensor file readers and writers
 * (npy.c, safetensors.c); private to runtime/, not installed. */
#ifndef KILN_IO_UTIL_H
#define KILN_IO_UTIL_H

#include <stdbool.h>
#include <stdio.h>

#include "kilnrt.h"

/* Writes "path: message" into errbuf (if any) and returns -1. */
__attribute__((format(printf, 4, 5))) int
krt_fail(char *errbuf, size_t errlen, const char *path, const char *fmt, ...);
/* fread of exactly n bytes. */
bool krt_read_exact(FILE *f, void *buf, size_t n);
/* Opens a regular file for reading and sets *size; NULL and errbuf if not. */
FILE *krt_open_read(const char *path, int64_t *size, char *errbuf,
                    size_t errlen);
/* The next n header bytes in a malloc'd buffer; NULL and errbuf on failure. */
char *krt_read_header(FILE *f, size_t n, const char *path, char *errbuf,
                      size_t errlen);
/* Reads nbytes of t's data into t->data, then makes bools 0 or 1. */
bool krt_read_data(FILE *f, krt_tensor *t, size_t nbytes);
/* Creates path for writing; NULL and errbuf on failure. */
FILE *krt_open_write(const char *path, char *errbuf, size_t errlen);
/* Closes a file from krt_open_write; `ok` false if a write failed.  On any
 * failure removes the partial file and returns -1 with errbuf. */
int krt_close_write(FILE *f, bool ok, const char *path, char *errbuf,
                    size_t errlen);

/* A .npy file's header: what krt_npy_read and the data loader (which maps
 * the file rather than read it) both need. */
typedef struct {
  krt_dtype dtype;
  int rank;
  int64_t dims[KRT_MAX_RANK];  /* each <= KRT_MAX_NUMEL; their product is
                                  not checked here */
  int64_t data_offset;         /* where the array's bytes start */
} krt_npy_header;
/* Reads the preamble and the header dict of the .npy file f (at its start;
 * size bytes long).  Fortran order, big-endian and unknown dtypes fail. */
int krt_npy_read_header(FILE *f, int64_t size, const char *path,
                        krt_npy_header *h, char *errbuf, size_t errlen);
/* The data after the header must be exactly nbytes: else "truncated" or
 * "trailing bytes". */
int krt_npy_check_data_size(const krt_npy_header *h, int64_t size,
                            int64_t nbytes, const char *path, char *errbuf,
                            size_t errlen);

#endif /* KILN_IO_UTIL_H */
