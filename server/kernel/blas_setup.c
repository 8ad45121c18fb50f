/*
 * blas_setup.c - OpenBLAS's core chosen from cpuid (and, for a benchmark, its
 * own threads declined) before the program computes anything (see
 * blas_setup.h for why a second exec is the only way).
 *
 * The loop guard is the variables themselves: the exec'd process finds
 * OPENBLAS_CORETYPE (and OPENBLAS_NUM_THREADS) set and never execs again.
 * BLAS_SETUP_MARK tells that process that the core was ours, not the
 * operator's, for the description in the start-up log and /v1/info; it is
 * removed at once so that nothing the server starts inherits it.
 */
#include "blas_setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "attention.h"

#define BLAS_SETUP_MARK "ATTN_BLAS_CORETYPE_AUTO"
#define BLAS_SETUP_WIDE_CORE "SkylakeX"
#define OPENBLAS_CORETYPE_VAR "OPENBLAS_CORETYPE"
#define OPENBLAS_THREADS_VAR "OPENBLAS_NUM_THREADS"

/* How the core was chosen, for blas_setup_chosen_by. */
static const char *chosen_by = "as OpenBLAS detected it";

/* The OpenBLAS core names whose kernels use 512-bit vectors (0.3.21). */
static int is_avx512_core(const char *core)
{
    static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
        if (strncasecmp(core, wide[i], strlen(wide[i])) == 0)
            return 1;
    return 0;
}

/* The AVX-512 subsets OpenBLAS's SkylakeX kernels use.  Under valgrind, which
 * emulates no AVX-512, cpuid says none of them, so nothing changes there. */
static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

static void current_core(char *core, size_t len)
{
    char config[256];
    int threads;
    attention_blas_describe(config, sizeof config, core, len, &threads);
}

void blas_setup_select(char **argv, int one_thread)
{
    int set_core = 0, set_threads = one_thread && getenv(OPENBLAS_THREADS_VAR) == NULL;
    if (getenv(OPENBLAS_CORETYPE_VAR) != NULL) {
        chosen_by = getenv(BLAS_SETUP_MARK) != NULL
                        ? "OPENBLAS_CORETYPE set at start-up: the CPU has AVX-512"
                        : "OPENBLAS_CORETYPE set by the operator";
        unsetenv(BLAS_SETUP_MARK);
    } else {
        char core[64];
        current_core(core, sizeof core);
        set_core = cpu_has_avx512() && !is_avx512_core(core);
    }
    if (!set_core && !set_threads)
        return;
    if ((set_core && (setenv(OPENBLAS_CORETYPE_VAR, BLAS_SETUP_WIDE_CORE, 1) != 0 ||
                      setenv(BLAS_SETUP_MARK, "1", 1) != 0)) ||
        (set_threads && setenv(OPENBLAS_THREADS_VAR, "1", 1) != 0))
        goto undo;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    /* Still here: the exec failed; go on with the kernels and threads this process has. */
    perror("attention: cannot run again with OpenBLAS's settings");
undo:
    if (set_core) {
        unsetenv(OPENBLAS_CORETYPE_VAR);
        unsetenv(BLAS_SETUP_MARK);
    }
    if (set_threads)
        unsetenv(OPENBLAS_THREADS_VAR);
}

const char *blas_setup_chosen_by(void)
{
    return chosen_by;
}
