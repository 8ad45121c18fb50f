/*
 * itest.h - the integration harness that every integration program (itest, v2test,
 * crashtest, hostile, sharetest) is built on: the test bookkeeping (one struct test per
 * named test, counted by test_end; harness.c), the servers under test (itest_server.c), HTTP
 * and expectation helpers (itest_expect.c), weight-set helpers (itest_sets.c), and the entry
 * point of every group of itest's tests.
 * The programs are ordinary clients: they start the real attention-server binary and speak
 * HTTP to it through client.c; nothing here links with the server's code.
 * Every function below reports a failed expectation into the caller's struct test and
 * returns 0 (or NULL); JSON values it returns are new references the caller releases.
 */
#ifndef ITEST_H
#define ITEST_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include "../ref/reference.h"
#include "client.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* Seconds to wait for the "listening on" line, and for the exit after SIGTERM. */
#define STARTUP_TIMEOUT_S 10.0
#define SHUTDOWN_TIMEOUT_S 15.0
/* Tolerance for float64 results of the randomized tests, and for float32 ones. */
#define FLOAT64_TOLERANCE 1e-9
#define FLOAT32_TOLERANCE 1e-4
/* The seed of the randomized tests; fixed so that every run sends the same requests. */
#define RANDOM_SEED 20240607u

/* ------------------------------------------------------------------------------------ */
/* Types                                                                                */
/* ------------------------------------------------------------------------------------ */

/*
 * One named test. A test starts with test_begin, records its first failed expectation
 * with expect_true (later ones are ignored, so the reason names the root cause), may add
 * lines of context with test_detail, and ends with test_end, which prints and counts it.
 */
struct test {
    char name[256];
    int failed;
    char reason[2048];
    char detail[8192]; /* extra lines printed under a failure, e.g. the response body */
};

enum server_id { SERVER_DEFAULT, SERVER_SMALL_LIMITS, SERVER_CORS, SERVER_SMALL_STORE, SERVER_COUNT };

/* How one kind of server is started: extra flags and extra environment. */
struct server_kind {
    const char *label;
    const char *const *args; /* NULL-terminated, appended after --port 0 --host 127.0.0.1 */
    const char *const *env;  /* NULL-terminated "NAME=value" strings */
};

struct server {
    const struct server_kind *kind;
    int attempted;           /* a start was tried (servers start on first use) */
    int running;             /* pid is our live child */
    pid_t pid;
    int stdout_fd;           /* read end of the server's stdout, or -1 */
    size_t extra_stdout;     /* bytes seen on stdout after the first line */
    char stderr_path[PATH_MAX];
    char data_dir[512];      /* --data-dir; "" means data-LABEL in the temporary directory */
    char base_url[512];      /* "http://HOST:PORT" from the banner */
    int port;                /* PORT of base_url */
    int append_stderr;       /* a restart adds to the stderr file instead of emptying it */
    int any_exit_status;     /* set by a test whose SIGTERM may end the server with another
                                status than 0 (the shutdown watchdog's 1): then only the
                                exit within the time is checked */
    char start_error[1024];
};

/*
 * What a weight-set store holds at one moment, to show that a refused request wrote
 * nothing: the list (names, times, sizes), the entries of the data directory and, for a
 * request about one set, that set's file (NULL when there is none).
 */
struct store_snapshot {
    char *list;
    char **entries;
    char path[PATH_MAX];
    char *file;
    size_t file_len;
};

/* ------------------------------------------------------------------------------------ */
/* Test bookkeeping and small utilities (harness.c)                                     */
/* ------------------------------------------------------------------------------------ */

/*
 * Starts a program's run: its name for messages, the --filter SUBSTR it was given (NULL:
 * every test), SIGPIPE ignored, the private temporary directory g_tmpdir.  Set
 * g_server_path before, so that a path that is not executable is warned about.  Returns -1
 * (after saying why) when the directory cannot be made.
 */
int harness_start(const char *program, const char *filter);

/* Adds one --filter SUBSTR (a program may be given several: a test is selected when its
 * name contains each; `--filter random/ --filter seed3` runs the random tests of seed 3). */
void harness_add_filter(const char *filter);

/* Returns 1 when some --filter was given. */
int harness_filtered(void);

/* Returns 1 when --filter selects the test of that name (every --filter given matches). */
int harness_selected(const char *name);

/*
 * Returns 1 when the steps of a program's group GROUP (whose tests are named "GROUP/...")
 * are to run: always, unless a --filter has a slash and does not start with "GROUP/".  So
 * "--filter crash/" runs only that group, "--filter torn" every group, reporting only the
 * tests whose name contains "torn".
 */
int harness_group_wanted(const char *group);

/* A test that is one check: reports the test NAME, failed with the formatted reason
 * unless ok. */
__attribute__((format(printf, 3, 4)))
void test_check(int ok, const char *name, const char *fmt, ...);

/* The failures counted so far. */
int harness_failures(void);

/*
 * Prints "N passed, N failed", removes g_tmpdir unless something failed or keep is set
 * (then it says where the server logs are) and returns the exit status: 0, or 1 when a
 * test failed.
 */
int harness_finish(int keep);

/* Starts test t named by the format; returns 0 when --filter leaves it out. */
__attribute__((format(printf, 2, 3)))
int test_begin(struct test *t, const char *fmt, ...);

/* Records a failure with the formatted reason unless cond holds; returns cond. */
__attribute__((format(printf, 3, 4)))
int expect_true(struct test *t, int cond, const char *fmt, ...);

/* Appends one line of context that is printed only if the test fails. */
__attribute__((format(printf, 2, 3)))
void test_detail(struct test *t, const char *fmt, ...);

/* Prints the verdict of t and counts it; a test --filter leaves out is neither, unless its
 * name starts with "server/" (the checks of every started server's start and exit). */
void test_end(struct test *t);

/* Private directory for bodies, headers and server logs; kept short so paths built
 * from it always fit in PATH_MAX. */
extern char g_tmpdir[];

/* Case-insensitive substring search (strcasestr is not POSIX). */
const char *find_case_insensitive(const char *haystack, const char *needle);

/* Copies up to 300 bytes of a body into out as one printable line, for failure reports. */
void body_snippet(const char *body, size_t len, char *out, size_t cap);

/* Returns the sorted entries of dir (without . and ..), NULL-terminated; NULL when unreadable. */
char **dir_entries(const char *dir, size_t *count);

/* Returns the names of the *.json files in dir, sorted, as a NULL-terminated array. */
char **list_json_files(const char *dir, size_t *count);

/* Frees a list from dir_entries or list_json_files; accepts NULL. */
void free_name_list(char **names);

/*
 * Lists the *.json files of dir (see list_json_files; the caller frees the list with
 * free_name_list) and reports the test test_name: dir must hold at least one such file,
 * "no *.json WHAT in DIR" otherwise.
 */
char **list_test_files(const char *dir, const char *test_name, const char *what, size_t *count);

/* Returns 1 when --filter selects any of the NULL-terminated test names. */
int any_selected(const char *const *names);

/* ------------------------------------------------------------------------------------ */
/* The servers under test (itest_server.c)                                              */
/* ------------------------------------------------------------------------------------ */

extern const char *const g_no_strings[];

extern const struct server_kind g_server_kinds[];

/* What the info test expects of each kind: body limit, element limit, compute threads
 * (0: one per available CPU, as the server reports them). */
extern const long long g_expected_max_body[];

extern const long long g_expected_max_elements[];

extern const long long g_expected_compute_threads[];


extern const char *g_server_path;

extern struct server g_servers[];

/* Prints the last `lines` lines of a server's stderr into the test's detail. */
void detail_stderr_tail(struct test *t, const struct server *s, int lines);

/*
 * Starts the server of the given kind: stdin from /dev/null, stdout to a pipe that we
 * read the banner from, stderr to a file in the temporary directory. Reports the start as
 * the test "server/LABEL/start". Returns 0 when the server is up.
 */
int server_start(struct server *s);

/* Like server_get, but records a failure in t when the server is not running. */
struct server *test_server(struct test *t, enum server_id id);

/*
 * Starts the test t named name on server id: returns 1 when the test is selected and the
 * server runs (*s is set; the caller ends the test), 0 when --filter leaves it out or the
 * server is down (then the failure has already been reported).
 */
int test_start(struct test *t, enum server_id id, struct server **s, const char *name);

/*
 * Waits for a server that was sent SIGTERM and reports three tests: it exits with status
 * 0 within SHUTDOWN_TIMEOUT_S, its stderr has no sanitizer report, and its stdout held
 * exactly the one banner line.  Returns 1 when it exited by itself within the time (with
 * any status), 0 when it had to be killed.
 */
int server_wait_exit(struct server *s);

/* Stops a server with SIGTERM and reports the three tests of server_wait_exit, whose
 * answer it returns. */
int server_stop(struct server *s);

/* Runs argv (no shell; argv[0] looked up in PATH) with stdout and stderr to /dev/null, in
 * the environment envp (NULL: this process's), and returns its exit status, or -1 when it
 * could not run or did not exit within timeout_s seconds. */
int run_quietly(const char *const *argv, char *const *envp, double timeout_s);

/* A tiny valid request used to show that a server still computes after bad input. */
extern const char g_tiny_request[];

/* Checks that server id still answers GET /healthz with 200 and a tiny POST with 200. */
void check_still_serving(const char *name_prefix, enum server_id id);

/*
 * Starts a step of a sequence of tests that build on each other (a set stored by one is
 * read by the next): like test_start, but the step runs whenever the server is up, even
 * when --filter leaves its report out, so that later steps find what it made. *report
 * says whether step_end prints it.
 */
int step_start(struct test *t, enum server_id id, struct server **s, const char *name, int *report);

/* Ends a step begun with step_start: prints and counts it when report is set. */
void step_end(struct test *t, int report);

/* ------------------------------------------------------------------------------------ */
/* HTTP and expectations (itest_expect.c)                                               */
/* ------------------------------------------------------------------------------------ */

/* Sends one request and waits for the response (which the caller frees). */
void http_call(const struct server *s, const struct client_request *rq, struct client_response *r);

/* Sends a request without a body. */
void http_simple(const struct server *s, const char *method, const char *path, struct client_response *r);

/* POSTs a JSON value (serialized compactly; jansson prints reals round-trippably). */
void http_post_json(const struct server *s, const char *path, const json_t *body, struct client_response *r);

/* Sends method to path with text as the body (NULL: no body); the caller frees r. */
void http_text(const struct server *s, const char *method, const char *path, const char *text,
               struct client_response *r);

/* Parses a response body as JSON; returns a new reference or NULL. */
json_t *response_json(const struct client_response *r);

/* Checks the status of r and, on a mismatch, shows the response body as context. */
int expect_status(struct test *t, const struct client_response *r, int want);

/* Checks that header name is present and contains want (case-insensitive). */
int expect_header_contains(struct test *t, const struct client_response *r, const char *name, const char *want);

/* Checks that header name is present with exactly the value want. */
int expect_header_equals(struct test *t, const struct client_response *r, const char *name, const char *want);

/*
 * Compares got with want element by element: at every depth both must be arrays of the
 * same length, and at the leaves both must be numbers with
 * |got - want| <= abs_tol + rel_tol * |want|. path (a buffer of path_cap bytes holding
 * the position so far, e.g. "output[2]") is extended in place and restored. Returns 1 on
 * a match; otherwise 0 with the first difference described in why.
 */
int json_numbers_close(const json_t *got, const json_t *want, double abs_tol, double rel_tol, char *path,
                       size_t path_cap, char *why, size_t why_cap);

/* Compares the member `key` of a response object with an expected value; records in t. */
int expect_close(struct test *t, const json_t *response, const char *key, const json_t *want, double abs_tol,
                 double rel_tol);

/* Returns a new JSON matrix of a rows x cols row-major array, or of its transpose. */
json_t *json_matrix(const double *a, size_t rows, size_t cols, int transpose);

/*
 * Returns a new JSON value for `batch` consecutive rows x cols matrices: a 3-D array when
 * batched, else the single 2-D matrix. With transpose each matrix is sent transposed.
 */
json_t *json_tensor(const double *a, size_t batch, size_t rows, size_t cols, int batched, int transpose);

/*
 * Returns a new JSON value for a batch x heads x lq x lk attention array with the axes
 * the contract asks for: the batch axis only when batched, the heads axis only when the
 * request named heads.
 */
json_t *json_attention(const double *attn, size_t batch, size_t heads, size_t lq, size_t lk, int batched,
                       int has_heads);

/* Returns a new JSON mask (count matrices of lq x lk; 3-D when as_3d) of booleans or 0/1. */
json_t *json_mask(const unsigned char *m, size_t count, size_t lq, size_t lk, int as_3d, int numeric);

/*
 * Checks that r is an error response as the contract defines it: a JSON object
 * {"error": {"code", "message", "field"?}} with a non-empty code and message and, when
 * present, a string field. Returns the error object (borrowed from *body_out, which the
 * caller releases), or NULL after recording the failure.
 */
const json_t *expect_error_body(struct test *t, const struct client_response *r, json_t **body_out);

/* Checks that a JSON member is an integer equal to want. */
int expect_json_integer(struct test *t, const json_t *obj, const char *path, const char *key, long long want);

/* Returns a uniform number in [-1, 1). */
double rng_uniform(uint64_t *state);

/* Fills n values uniform in [-magnitude, magnitude), rounded to float when float32. */
double *random_values(uint64_t *state, size_t n, double magnitude, int float32);

/*
 * Checks that v is a nested array of exactly the shape dims (every row of it, not only
 * the first) with numbers at the leaves. Returns 1, or 0 with the difference in why.
 */
int json_has_shape(const json_t *v, const size_t *dims, size_t rank, char *path, size_t cap, char *why,
                   size_t why_cap);

/*
 * Checks that r is an error answer with this status and code. field: NULL leaves
 * error.field unchecked, "" requires it to be absent, anything else must equal it.
 * Returns 1 when everything holds.
 */
int expect_error(struct test *t, const struct client_response *r, int status, const char *code,
                 const char *field);

/*
 * Compares got with want: objects member by member (the same members both ways), arrays
 * element by element, strings, booleans and null by value, and numbers by the bits of
 * their doubles when bits is set, else by value (so 1 equals 1.0). path (a buffer of
 * path_cap bytes, the position so far) is extended in place and restored. Returns 1 when
 * equal; otherwise 0 with the first difference in why.
 */
int json_same(const json_t *got, const json_t *want, int bits, char *path, size_t path_cap, char *why,
              size_t why_cap);

/* json_same from the root, recording a difference in t; what names the two values. */
int expect_same(struct test *t, const json_t *got, const json_t *want, int bits, const char *what);

/* Parses an RFC 3339 UTC time "YYYY-MM-DDTHH:MM:SS[.frac]Z" (or +00:00); returns Unix
 * seconds, or -1 when the text is not such a time. */
double parse_utc_time(const char *text);

/* ------------------------------------------------------------------------------------ */
/* Weight-set helpers (itest_sets.c)                                                    */
/* ------------------------------------------------------------------------------------ */

/* The members of a weight set that hold numbers, in the order of the file format. */
extern const char *const g_set_members[];

/* Checks that dir holds exactly the entries it held before (a snapshot from dir_entries). */
void expect_dir_unchanged(struct test *t, const char *dir, char **before);

/* Returns the size of a file, or -1 when it does not exist. */
long long file_size(const char *path);

/* The path of a set's file as README documents it: DATA_DIR/NAME.wset. */
void set_file_path(char *out, size_t cap, const char *data_dir, const char *name);

/*
 * Checks a weight-set summary (the answer to a PUT, or an entry of the list) against the
 * set that was sent under name: name, weights_layout, heads (null when the set has none),
 * shapes as written, parameters, size_bytes (the size of NAME.wset in data_dir, when
 * data_dir is not NULL) and stored_at (RFC 3339 UTC, within two minutes of now).
 */
void expect_set_summary(struct test *t, const json_t *summary, const char *name, const json_t *sent,
                        const char *data_dir);

/*
 * Checks the body of GET /v1/weight-sets/NAME against the set that was PUT: the same
 * numeric members, each number bit for bit and in the shape it was sent (so an out_in set
 * comes back out_in), weights_layout as sent (in_out when the PUT had none), and heads as
 * sent (absent or null when the PUT had none).
 */
void expect_set_body(struct test *t, const json_t *got, const json_t *sent);

/* Parses JSON text that this program wrote (aborts on a typo, which is a bug here). */
json_t *json_from_text(const char *text);

/* GETs the list and returns its weight_sets array (a new reference), or NULL after
 * recording the failure in t. */
json_t *get_set_list(struct test *t, const struct server *s);

/* Returns the entry named name of a weight_sets array (borrowed), or NULL. */
const json_t *list_find(const json_t *list, const char *name);

/* PUTs a set given as JSON text and checks the status; returns the parsed answer (new
 * reference) or NULL. */
json_t *put_set_text(struct test *t, const struct server *s, const char *name, const char *text, int want);

/* Like put_set_text for a JSON value. */
json_t *put_set(struct test *t, const struct server *s, const char *name, const json_t *set, int want);

/* GETs a set; returns the body (new reference) when the status is want (200), else NULL. */
json_t *get_set(struct test *t, const struct server *s, const char *name, int want);

/* GETs the set name (expecting 200) and checks it against sent with expect_set_body. */
void expect_stored_set(struct test *t, const struct server *s, const char *name, const json_t *sent);

/* The step name on server id that only GETs the set set_name and checks it against sent. */
void step_expect_stored_set(const char *name, enum server_id id, const char *set_name, const json_t *sent);

/*
 * Returns a new weight set of random numbers with these widths: the weights members
 * (matrices written d_in x d_out, or transposed for out_in), plus weights_layout and
 * heads when set_heads / out_in ask for them.
 */
json_t *random_weight_set(uint64_t *rng, size_t d_in, size_t d_ctx, size_t dk, size_t dv, size_t d_out,
                          int biases, int bo, int out_in, size_t heads);

/* Returns a new copy of a set's numeric members only (what a request's "weights" holds). */
json_t *weights_of(const json_t *set);

/*
 * Compares the answer to a request that names a set with the answer to the same request
 * with the weights inline: output and attention within 1e-12 (the same arithmetic should
 * give the same doubles), and the meta block's shape members.
 */
void expect_same_answer(struct test *t, const json_t *named, const json_t *inline_body);

/* Numbers that a careless formatter or parser would not bring back bit for bit: 0.1, the
 * double nearest 1/3, subnormals down to 5e-324, the largest double, 0.1 + 0.2, ... */
extern const char g_awkward_set[];

/* What replaces it: other shapes (d_in 1, d_ctx 2), heads, and only some biases. */
extern const char g_replacement_set[];

/* An out_in set (PyTorch's d_out x d_in) with rectangular matrices, so that a transpose
 * anywhere shows: wq 4x3 (dk 4, d_in 3), wv 2x3 (dv 2), wo 5x2 (d_out 5), two heads. */
extern const char g_out_in_set[];

/* A tiny set for names and lists. */
extern const char g_tiny_set[];

/*
 * Records in snap what the store of server s holds now (the set name's file too when name
 * is not NULL). The caller releases snap with store_snapshot_free.
 */
void store_snapshot_take(struct test *t, const struct server *s, const char *name, struct store_snapshot *snap);

/* Checks that the store of s still holds exactly what snap recorded: the same list, the
 * same data-directory entries (and no temporary file), the set's file byte for byte. */
void expect_store_unchanged(struct test *t, const struct server *s, struct store_snapshot *snap);

/* Frees what store_snapshot_take recorded; snap may be all zero. */
void store_snapshot_free(struct store_snapshot *snap);

/* ------------------------------------------------------------------------------------ */
/* The groups of tests, one file each, run in this order by main (itest.c)              */
/* ------------------------------------------------------------------------------------ */

/* The directories a run reads: --fixtures, --cases and --examples (all borrowed). */
struct itest_paths {
    const char *fixtures;
    const char *cases;
    const char *examples;
};

/* Each group reports its tests through test_end; main lists them in g_groups. */
void run_fixture_tests(const struct itest_paths *paths); /* itest_fixtures.c */
void run_case_tests(const struct itest_paths *paths); /* itest_cases.c */
void run_protocol_tests(const struct itest_paths *paths); /* itest_protocol.c */
void run_random_tests(const struct itest_paths *paths); /* itest_random.c */
void run_concurrency_tests(const struct itest_paths *paths); /* itest_concurrency.c */
void run_weight_set_tests(const struct itest_paths *paths); /* itest_weight_sets.c */
void run_named_attention_tests(const struct itest_paths *paths); /* itest_named.c */
void run_example_tests(const struct itest_paths *paths); /* itest_examples.c */
void run_replace_concurrency_tests(const struct itest_paths *paths); /* itest_replace.c */
void run_restart_tests(const struct itest_paths *paths); /* itest_restart.c */
void run_pin_tests(const struct itest_paths *paths); /* itest_pins.c */
void run_drain_tests(const struct itest_paths *paths); /* itest_drain.c */
void run_guard_tests(const struct itest_paths *paths); /* itest_guard.c */
void run_inline_tests(const struct itest_paths *paths); /* itest_inline.c */

#endif
