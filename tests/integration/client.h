/*
 * client.h - the client side that the two integration programs share (itest.c, the
 * integration runner, and crashtest.c, the kill -9 test): starting the real server binary
 * on a free loopback port and reading its "listening on http://HOST:PORT" line, waiting
 * for it to exit, speaking HTTP to it through the curl command-line tool, and the few
 * file, time and random-number helpers both need.
 *
 * Both programs test the server from the outside, as a user would: the server is a child
 * process started with fork/exec, and every HTTP call is made by curl, started with an
 * argument vector (never through a shell). Request bodies go to curl through files in a
 * work directory the caller owns, and curl writes the status, the headers and the body to
 * files there that are read back and removed.
 *
 * Conventions: a function that can fail returns 0 (or a pid, a port, a buffer) on success
 * and -1 (or NULL) on failure, and says why in a caller-provided buffer where it has one.
 * Running out of memory is not a failure the tests can go on after: it ends the program
 * with exit status 2 and a message that starts with the name given to
 * client_set_program_name.
 */
#ifndef CLIENT_H
#define CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ------------------------------------------------------------------------------------ */
/* Small utilities                                                                       */
/* ------------------------------------------------------------------------------------ */

/*
 * Sets the name that starts this module's messages ("itest: out of memory"). name is
 * borrowed and must stay valid while the program runs; until this is called, "client" is
 * used.
 */
void client_set_program_name(const char *name);

/*
 * calloc that never returns NULL: a count or size of 0 is treated as 1, and when memory
 * runs out the program ends (exit status 2). The caller frees the block with free().
 */
void *client_xcalloc(size_t count, size_t size);

/* realloc that never returns NULL: when memory runs out the program ends (exit status 2). */
void *client_xrealloc(void *p, size_t size);

/* Returns the seconds of the monotonic clock (for deadlines and durations). */
double client_now_seconds(void);

/* Sleeps ms milliseconds, going on after an interrupting signal. */
void client_sleep_ms(long ms);

/*
 * splitmix64: advances *state and returns the next 64 well-mixed bits. The same state
 * always gives the same sequence, so a seed makes a run repeatable.
 */
uint64_t client_rng_next(uint64_t *state);

/* ------------------------------------------------------------------------------------ */
/* Files and directories                                                                 */
/* ------------------------------------------------------------------------------------ */

/*
 * Reads a whole file into a new NUL-terminated buffer (the NUL is not counted in *len)
 * that the caller frees. Returns NULL, with *len set to 0, when the file cannot be opened.
 */
char *client_read_file(const char *path, size_t *len);

/* Writes len bytes of data to path, replacing the file. Returns 0, or -1 on any error. */
int client_write_file(const char *path, const char *data, size_t len);

/*
 * Creates a new private directory PARENT/PREFIXxxxxxx (mkdtemp) and writes its path into
 * out (cap bytes). parent NULL means $TMPDIR when it is set, non-empty and at most 200
 * bytes long, else /tmp. Returns 0, or -1 with errno set.
 */
int client_make_temp_dir(char *out, size_t cap, const char *parent, const char *prefix);

/*
 * Removes dir and everything under it, without following symbolic links. Meant for the
 * temporary directories of the tests; errors are ignored, and a dir that cannot be opened
 * is left alone.
 */
void client_remove_tree(const char *dir);

/*
 * Counts the lines of the file at path (a server's stderr) that a sanitizer wrote
 * (AddressSanitizer, LeakSanitizer, UBSan's "runtime error:", ThreadSanitizer,
 * MemorySanitizer) and copies the first of them, cut to 300 bytes, into first (cap
 * bytes; "" when there is none). A file that cannot be read counts as 0 lines.
 */
int client_count_sanitizer_lines(const char *path, char *first, size_t cap);

/* ------------------------------------------------------------------------------------ */
/* The server process                                                                    */
/* ------------------------------------------------------------------------------------ */

/*
 * Starts the server binary argv[0] with the NULL-terminated argv and envp (NULL: this
 * program's environment); both are borrowed. The child reads /dev/null, writes its stdout
 * to a pipe whose read end (close-on-exec) is returned in *stdout_fd for the caller to
 * read the banner from and to close, and its stderr to stderr_path, which is truncated
 * first unless append is non-zero. On Linux the child is killed when this program dies.
 * Returns the child's pid, or -1 with the reason in why (why_cap bytes) and nothing left
 * open.
 */
pid_t client_spawn_server(const char *const *argv, char *const *envp, const char *stderr_path, int append,
                          int *stdout_fd, char *why, size_t why_cap);

/*
 * Waits at most timeout_s seconds for the server's first stdout line on fd and parses it
 * as "listening on http://HOST:PORT" (a trailing CR is allowed). On success returns the
 * port and writes "http://HOST:PORT" into base_url (url_cap bytes) and, when extra is not
 * NULL, how many bytes came after the line into *extra. Returns -1 with the reason in why
 * when the line does not come in time, stdout closes first (the server died), or the line
 * is something else. fd stays open in every case.
 */
int client_read_banner(int fd, double timeout_s, char *base_url, size_t url_cap, size_t *extra, char *why,
                       size_t why_cap);

/*
 * Waits at most timeout_s seconds for the child pid to exit, polling every 20 ms. Returns
 * 1 when it exited (its wait status in *status), 0 when it still ran at the deadline (it
 * is then killed with SIGKILL and reaped, and *status is the status of that end), and -1
 * when waitpid failed (errno says why; *status is left as it was).
 */
int client_wait_exit(pid_t pid, double timeout_s, int *status);

/* Sends SIGKILL to the child pid and reaps it; its wait status goes to *status unless
 * status is NULL. */
void client_kill_and_reap(pid_t pid, int *status);

/* ------------------------------------------------------------------------------------ */
/* HTTP through the curl command-line tool                                               */
/* ------------------------------------------------------------------------------------ */

#define CLIENT_MAX_EXTRA_HEADERS 16
#define CLIENT_MAX_RESPONSE_HEADERS 64

/* One request. Every pointer is borrowed; body may hold NUL bytes (body_len counts them). */
struct client_request {
    const char *method;         /* "GET", "POST", "HEAD", "OPTIONS", ... */
    const char *path;           /* appended to the server's base URL, e.g. "/v1/attention" */
    const char *request_target; /* NULL, or a literal request target such as "*" */
    const char *body;           /* NULL for no body at all; "" with body_len 0 for an empty one */
    size_t body_len;
    const char *headers[CLIENT_MAX_EXTRA_HEADERS + 1]; /* "Name: value", NULL-terminated */
    const char *const *curl_args; /* NULL, or extra curl options, NULL-terminated (e.g. --limit-rate) */
};

/* One response; everything in it is owned by it and freed by client_response_free. */
struct client_response {
    int status;    /* the HTTP status, or 0 when no response arrived */
    char *body;    /* never NULL once filled; NUL-terminated (the NUL is not counted in body_len) */
    size_t body_len;
    size_t header_count;
    char *header_names[CLIENT_MAX_RESPONSE_HEADERS];
    char *header_values[CLIENT_MAX_RESPONSE_HEADERS];
    int curl_exit; /* curl's exit code (128 + N when signal N ended it), -1 when it did not start */
    char transport_error[512]; /* curl's complaint, empty when curl exited 0 */
};

/* A request in flight: the curl process and the stem of its files in the work directory. */
struct client_pending {
    pid_t pid;       /* -1 when curl could not be started */
    int reaped;      /* client_http_done saw curl exit; wait_status holds its status */
    int wait_status;
    int is_head;
    char stem[288];  /* WORK_DIR/req-N */
    char start_error[512];
};

/*
 * Starts curl for one request to base_url ("http://HOST:PORT", borrowed) without waiting
 * for it. work_dir is a directory of the caller's, at most 255 bytes long, where the
 * request's files (WORK_DIR/req-N.*) live until client_http_finish removes them. The body
 * goes through a file (--data-binary @file keeps every byte); a JSON Content-Type is added
 * to a request with a body unless it names its own, and "Expect:" turns off
 * 100-continue. Curl gets 5 s to connect and 60 s in all. Always fills p, which must then
 * go to client_http_finish; when curl could not be started p->pid is -1 and
 * client_http_finish reports p->start_error.
 */
void client_http_start(const char *base_url, const char *work_dir, const struct client_request *rq,
                       struct client_pending *p);

/* Returns 1 when the curl process of p has exited (without waiting; p remembers it), else 0. */
int client_http_done(struct client_pending *p);

/*
 * Waits for the curl process of p, fills r (the caller frees it with
 * client_response_free) and removes the request's files. A request that got no answer
 * has status 0 and says why in r->transport_error.
 */
void client_http_finish(struct client_pending *p, struct client_response *r);

/* Sends one request and waits for its response: client_http_start then client_http_finish. */
void client_http_call(const char *base_url, const char *work_dir, const struct client_request *rq,
                      struct client_response *r);

/* Frees what r owns and zeroes it; a zeroed response may be freed again. */
void client_response_free(struct client_response *r);

/* Returns the value of the named response header (case-insensitive, borrowed from r), or
 * NULL. */
const char *client_header(const struct client_response *r, const char *name);

/*
 * Adds the "Name: value" lines of a header block (text, which is modified) to the headers
 * of r. The text may hold several responses (a 100 Continue, say); only the last block
 * counts, so the list restarts at every status line. Headers past
 * CLIENT_MAX_RESPONSE_HEADERS are dropped.
 */
void client_parse_headers(char *text, struct client_response *r);

/* ------------------------------------------------------------------------------------ */
/* Raw TCP, for what an HTTP client would refuse to send                                  */
/* ------------------------------------------------------------------------------------ */

/*
 * Connects to 127.0.0.1:port, sends the len bytes of data as they are, then reads until
 * the server closes the connection or timeout_s seconds pass. Returns what arrived in a
 * new NUL-terminated buffer (the NUL is not counted in *out_len) that the caller frees, and
 * sets *closed to 1 when the server closed the connection before the deadline. Returns
 * NULL when the connection cannot be made.
 */
char *client_raw_exchange(int port, const char *data, size_t len, double timeout_s, size_t *out_len,
                          int *closed);

/*
 * client_raw_exchange read as HTTP: fills r (the caller frees it with client_response_free)
 * with the first answer's status, headers and body (its Content-Length bytes, or all that
 * followed its headers when it names no length), sets *answers to the number of status lines
 * that begin a line of what arrived and *closed as client_raw_exchange does. When the
 * connection cannot be made, r has status 0 and says so in r->transport_error.
 */
void client_raw_call(int port, const char *data, size_t len, double timeout_s, struct client_response *r,
                     int *answers, int *closed);

#endif
