/*
 * blas_setup.h - makes OpenBLAS run the widest kernels this CPU has.
 *
 * Debian's OpenBLAS 0.3.21 does not know every AVX-512 CPU (AMD's Zen 4 among
 * them) and runs its AVX2 (Haswell or Zen) kernels there: half the vector
 * width.  OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads, so the
 * choice can only be changed by running the program again with the variable
 * set.  blas_setup_select does that, first thing in main().
 */
#ifndef BLAS_SETUP_H
#define BLAS_SETUP_H

/* When OPENBLAS_CORETYPE is unset, the CPU has AVX-512 (F, DQ, BW and VL) and
 * OpenBLAS did not pick an AVX-512 core, sets OPENBLAS_CORETYPE=SkylakeX and
 * executes /proc/self/exe with argv again; the new process finds the variable
 * set and goes on.  Otherwise, or when the exec fails (reported on stderr), it
 * returns and the program goes on with the kernels it has.  An operator who
 * sets OPENBLAS_CORETYPE chooses for it.  argv is main's, NULL-terminated. */
void blas_setup_select(char **argv);

/* How the core in use was chosen, for the start-up log and /v1/info: "as
 * OpenBLAS detected it", "OPENBLAS_CORETYPE set by the operator" or
 * "OPENBLAS_CORETYPE set at start-up: the CPU has AVX-512".  A static string. */
const char *blas_setup_chosen_by(void);

#endif
