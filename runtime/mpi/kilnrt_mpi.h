/* kilnrt_mpi.h - libkilnrt_mpi: the communicator of a data-parallel
 * training run over MPI (docs/SCALING.md).  The one part of the runtime
 * that needs MPI, so it is a library of its own: a program links it
 * (-lkilnrt_mpi before -lkilnrt, and libmpi) only when its step was
 * compiled with --data-parallel.  One public header for runtime/mpi/. */
#ifndef KRT_KILNRT_MPI_H
#define KRT_KILNRT_MPI_H

#include "../kilnrt.h"

/* A krt_comm_opener: under an MPI launcher (mpirun), MPI_Init_thread and
 * a communicator over MPI_COMM_WORLD whose collectives a thread of its own
 * progresses; started any other way, *out = NULL (one rank) and 0. */
int krt_comm_mpi_open(int *argc, char ***argv, double timeout_s, krt_comm **out, char *err,
                      size_t errlen);

/* krt_exe_main for a data-parallel training step: krt_train_main_with
 * krt_comm_mpi_open. */
int krt_exe_main_mpi(const krt_model_api *api, int argc, char **argv);

#endif /* KRT_KILNRT_MPI_H */
