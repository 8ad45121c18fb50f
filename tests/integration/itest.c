/*
 * itest.c - the integration runner's main program: its groups of tests and their order (the
 * test bookkeeping is harness.c's, shared with the other integration programs). It starts the
 * real attention-server binary on free loopback ports and holds it, over HTTP, to the
 * behaviour that api/openapi.yaml and README.md describe.
 *
 * Every HTTP call is made by the curl command-line tool (client.c, shared with
 * crashtest.c), started with fork/exec and an argument vector, never through a shell, so
 * that what is tested is exactly what a user with curl would see.
 *
 * The groups of tests are listed once, in g_groups below, one file each:
 *   fixtures     (itest_fixtures.c)     every golden case in --fixtures DIR;
 *   cases        (itest_cases.c)        the data-driven cases of --cases DIR: one request
 *                                       and its expected answer each (cases/README.md);
 *   protocol     (itest_protocol.c)     /v1/info and /metrics (health, CORS and 405s are
 *                                       cases/protocol.json);
 *   random       (itest_random.c)       randomized requests against the reference;
 *   concurrency  (itest_concurrency.c)  parallel valid requests mixed with garbage;
 *   weight-sets  (itest_weight_sets.c)  round trips bit for bit, summaries, list, DELETE;
 *   named        (itest_named.c)        attention by name equals the weights inline;
 *   examples     (itest_examples.c)     api/examples (--examples DIR);
 *   replace-concurrency (itest_replace.c) sets used while replaced and deleted;
 *   restart      (itest_restart.c)      sets survive a restart; damaged files quarantined;
 *   drain        (itest_drain.c)        SIGTERM while a request computes and one uploads;
 *   guard        (itest_guard.c)        tokens, CORS lists, Host checks, framing, TLS,
 *                                       --quiet, and the other signals;
 *   inline       (itest_inline.c)       small requests answered on the I/O thread: the
 *                                       same answers, the work bound, --inline-max-bytes.
 * Servers start on first use, one per kind in itest_server.c ("default", "small-limits",
 * "cors", "small-store"); restart, drain, guard and inline start and stop their own after the shared
 * ones have stopped. Every server gets its own --data-dir in the temporary directory,
 * never the checkout's, and an environment without ATTN_* variables, so the defaults the
 * tests expect hold whatever the caller's environment says. Each server must exit 0 within
 * 15 s of SIGTERM with no sanitizer report on its stderr; these "server/..." checks run for
 * every server that was started, whatever --filter says.
 *
 * Output: one line per test, "ok   NAME" or "FAIL NAME: reason", then "N passed, N failed".
 * The exit status is 0 when nothing failed, 1 when something did, 2 on a usage error.
 *
 * Run: build/itest --server build/attention-server --fixtures tests/fixtures \
 *                  --cases tests/integration/cases [--examples api/examples] [--filter SUBSTR]
 * Steps of the weight-sets group, like the cases of one case file, build on each other, so
 * they all run when --filter selects any of them (only the selected ones are reported).
 */
#include "itest.h"

/* ------------------------------------------------------------------------------------ */
/* Main                                                                                 */
/* ------------------------------------------------------------------------------------ */

/* The groups, in the order they run. Those marked own_servers start and stop servers of
 * their own, and run after the shared servers have been stopped and checked. */
static const struct {
    const char *name;
    void (*run)(const struct itest_paths *paths);
    int own_servers;
} g_groups[] = {
    {"fixtures", run_fixture_tests, 0},
    {"cases", run_case_tests, 0},
    {"protocol", run_protocol_tests, 0},
    {"random", run_random_tests, 0},
    {"concurrency", run_concurrency_tests, 0},
    {"weight-sets", run_weight_set_tests, 0},
    {"named", run_named_attention_tests, 0},
    {"examples", run_example_tests, 0},
    {"replace-concurrency", run_replace_concurrency_tests, 0},
    {"restart", run_restart_tests, 1},
    {"pins", run_pin_tests, 1},
    {"drain", run_drain_tests, 1},
    {"guard", run_guard_tests, 1},
    {"inline", run_inline_tests, 1},
};
#define GROUP_COUNT (sizeof g_groups / sizeof g_groups[0])

static void usage(FILE *to, const char *argv0)
{
    fprintf(to,
            "usage: %s --server PATH --fixtures DIR --cases DIR [--examples DIR] [--filter SUBSTR]\n"
            "  Starts the attention server at PATH on free loopback ports and runs the\n"
            "  integration tests; --filter runs only tests whose name contains SUBSTR.\n"
            "  --examples is the directory of the API examples (default: api/examples).\n",
            argv0);
}

int main(int argc, char **argv)
{
    const char *fixtures = NULL, *cases = NULL, *examples = "api/examples";
    for (int i = 1; i < argc; i += 2) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout, argv[0]);
            return 0;
        } else if (strcmp(argv[i], "--server") == 0 && value != NULL) {
            g_server_path = value;
        } else if (strcmp(argv[i], "--fixtures") == 0 && value != NULL) {
            fixtures = value;
        } else if (strcmp(argv[i], "--cases") == 0 && value != NULL) {
            cases = value;
        } else if (strcmp(argv[i], "--examples") == 0 && value != NULL) {
            examples = value;
        } else if (strcmp(argv[i], "--filter") == 0 && value != NULL) {
            harness_add_filter(value);
        } else {
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (g_server_path == NULL || fixtures == NULL || cases == NULL) {
        usage(stderr, argv[0]);
        return 2;
    }

    if (harness_start("itest", NULL) != 0)
        return 2;

    struct itest_paths paths = {fixtures, cases, examples};
    for (size_t i = 0; i < GROUP_COUNT; i++)
        if (!g_groups[i].own_servers)
            g_groups[i].run(&paths);
    for (int id = 0; id < SERVER_COUNT; id++)
        if (g_servers[id].running)
            server_stop(&g_servers[id]);
    for (size_t i = 0; i < GROUP_COUNT; i++)
        if (g_groups[i].own_servers)
            g_groups[i].run(&paths);

    return harness_finish(0);
}
