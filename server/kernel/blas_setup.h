/*
 * blas_setup.h - makes OpenBLAS run the widest kernels this CPU has, and, for
 * a benchmark, start no threads of its own.
 *
 * Debian's OpenBLAS 0.3.21 does not know every AVX-512 CPU (AMD's Zen 4 among
 * them) and runs its AVX2 (Haswell or Zen) kernels there: half the vector
 * width.  And it starts a worker thread per core when it loads, each of which
 * spins (calling sched_yield) for about a tenth of a second before it sleeps.
 * The server runs OpenBLAS on the calling thread only
 * (attention_blas_set_threads(1)), so its workers sleep for good after its
 * start; a benchmark that times the kernel within that tenth of a second
 * would share the cores with them (docs/performance.md).  OpenBLAS reads
 * OPENBLAS_CORETYPE and OPENBLAS_NUM_THREADS once, when the library loads,
 * so either can only be changed by running the program again with the
 * variable set.  blas_setup_select does that, first thing in main().
 */
#ifndef BLAS_SETUP_H
#define BLAS_SETUP_H

/* When OPENBLAS_CORETYPE is unset, the CPU has AVX-512 (F, DQ, BW and VL) and
 * OpenBLAS did not pick an AVX-512 core, sets OPENBLAS_CORETYPE=SkylakeX; with
 * one_thread, when OPENBLAS_NUM_THREADS is unset, sets it to 1.  When it set
 * either, it executes /proc/self/exe with argv again, once: the new process
 * finds the variables set and goes on.  Otherwise, or when the exec fails
 * (reported on stderr), it returns and the program goes on with the kernels
 * and threads it has.  An operator who sets a variable chooses for it.  argv
 * is main's, NULL-terminated.  The server passes one_thread 0: the exec
 * would buy it a tenth of a second, and under valgrind, whose emulated CPU
 * shows no AVX-512, it then never execs (there /proc/self/exe is valgrind
 * itself). */
void blas_setup_select(char **argv, int one_thread);

/* How the core in use was chosen, for the start-up log and /v1/info: "as
 * OpenBLAS detected it", "OPENBLAS_CORETYPE set by the operator" or
 * "OPENBLAS_CORETYPE set at start-up: the CPU has AVX-512".  A static string. */
const char *blas_setup_chosen_by(void);

#endif
