/*
 * itest_drain.c - draining on SIGTERM: a request that is computing and one that is still
 * uploading both get their whole answer, new connections are refused, and the server
 * exits 0.
 */
#include "itest.h"

/* The slow request: 4 x 2000 tokens of width 8 projected to dk = DRAIN_DK (about 65 GFLOP
 * of QK^T) and dv = 64, without the attention matrix. Its answer
 * (512000 numbers, about 10 MB) is more than the kernel buffers of a loopback connection
 * hold, and its client reads at most 16 MB/s, so the answer is still being sent for a
 * few hundred milliseconds after the computation ends. */
#define DRAIN_BATCH 4
#define DRAIN_TOKENS 2000
#define DRAIN_DV 64
/* The projection width sets how long the slow request computes (L^2 * DK) without making
 * its answer larger: it must still be running 0.4 s after it was sent, with room to spare
 * on a fast machine (it takes about a second on two cores). */
#define DRAIN_DK 2048

/* Returns the text of the slow request; numbers are multiples of 1/8 so the body stays short. */
static char *drain_request_text(void)
{
    uint64_t rng = RANDOM_SEED + 777u;
    json_t *req = json_object(), *x = json_array(), *w = json_object();
    for (size_t b = 0; b < DRAIN_BATCH; b++) {
        json_t *m = json_array();
        for (size_t i = 0; i < DRAIN_TOKENS; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < 8; j++)
                json_array_append_new(row, json_real((double)(client_rng_next(&rng) % 17) / 8.0 - 1.0));
            json_array_append_new(m, row);
        }
        json_array_append_new(x, m);
    }
    const size_t widths[3] = {DRAIN_DK, DRAIN_DK, DRAIN_DV};
    for (int k = 0; k < 3; k++) {
        json_t *m = json_array();
        for (size_t i = 0; i < 8; i++) {
            json_t *row = json_array();
            for (size_t j = 0; j < widths[k]; j++)
                json_array_append_new(row, json_real((double)(client_rng_next(&rng) % 17) / 64.0 - 0.125));
            json_array_append_new(m, row);
        }
        json_object_set_new(w, g_set_members[k], m);
    }
    json_object_set_new(req, "x", x);
    json_object_set_new(req, "weights", w);
    json_object_set_new(req, "return_attention", json_false());
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return text;
}

/*
 * A raw HTTP/1.1 client over one TCP connection, for the one request of the drain test
 * that needs what curl cannot do: a small receive buffer, and reading that starts late
 * and goes slowly, so that the server is still sending the answer long after it computed
 * it (whatever the loopback buffers of the machine hold).
 */

/* Connects to the server with a receive buffer of rcvbuf bytes; returns the socket or -1. */
static int raw_connect(const struct server *s, int rcvbuf, char *why, size_t cap)
{
    const char *colon = strrchr(s->base_url, ':');
    int port = colon != NULL ? atoi(colon + 1) : 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(why, cap, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf); /* before connect: sets the window */
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        snprintf(why, cap, "connect to port %d: %s", port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Sends a POST with body over fd (Connection: close); returns 0 or -1. */
static int raw_post(int fd, const char *path, const char *body, size_t len)
{
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n", path, len);
    const char *parts[2] = {head, body};
    size_t sizes[2] = {(size_t)n, len};
    for (int i = 0; i < 2; i++) {
        size_t done = 0;
        while (done < sizes[i]) {
            ssize_t w = write(fd, parts[i] + done, sizes[i] - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return -1;
            done += (size_t)w;
        }
    }
    return 0;
}

/* Returns 1 when fd has bytes (or EOF) to read now. */
static int raw_readable(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, 0) > 0;
}

/*
 * Reads the answer from fd at most rate bytes per second until the connection closes or
 * Content-Length bytes of body arrived (at most timeout_s), and fills r like
 * client_http_finish; a body shorter than its Content-Length is a transport error.
 */
static void raw_read_response(int fd, double rate, double timeout_s, struct client_response *r)
{
    memset(r, 0, sizeof *r);
    size_t cap = 1 << 20, used = 0, header_len = 0;
    long long content_length = -1;
    char *buf = client_xcalloc(cap, 1);
    double start = client_now_seconds(), first_byte = -1;
    for (;;) {
        if (header_len > 0 && content_length >= 0 && used - header_len >= (size_t)content_length)
            break;
        double left = start + timeout_s - client_now_seconds();
        struct pollfd pfd = {fd, POLLIN, 0};
        if (left <= 0 || poll(&pfd, 1, (int)(left * 1000) + 1) <= 0) {
            snprintf(r->transport_error, sizeof r->transport_error, "no complete answer within %.0f s", timeout_s);
            break;
        }
        if (used + 65536 + 1 > cap) {
            cap *= 2;
            buf = client_xrealloc(buf, cap);
        }
        ssize_t got = read(fd, buf + used, 65536);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got < 0)
                snprintf(r->transport_error, sizeof r->transport_error, "read: %s", strerror(errno));
            break;
        }
        used += (size_t)got;
        buf[used] = '\0';
        if (header_len == 0) {
            char *end = strstr(buf, "\r\n\r\n");
            if (end != NULL) {
                header_len = (size_t)(end + 4 - buf);
                r->status = strncmp(buf, "HTTP/1.", 7) == 0 ? atoi(buf + 9) : 0;
                char *headers = client_xcalloc(header_len + 1, 1);
                memcpy(headers, buf, header_len);
                client_parse_headers(headers, r);
                free(headers);
                const char *length = client_header(r, "Content-Length");
                content_length = length != NULL ? atoll(length) : -1;
            }
        }
        /* Keep to the rate from the first byte on: the bytes so far may not have taken less
         * than used / rate. */
        if (first_byte < 0)
            first_byte = client_now_seconds();
        double ahead = (double)used / rate - (client_now_seconds() - first_byte);
        if (ahead > 0)
            client_sleep_ms((long)(ahead * 1000));
    }
    size_t body_len = header_len > 0 ? used - header_len : 0;
    if (r->transport_error[0] == '\0' && header_len == 0)
        snprintf(r->transport_error, sizeof r->transport_error, "the connection closed after %zu bytes, before "
                 "the end of the headers", used);
    else if (r->transport_error[0] == '\0' && content_length >= 0 && body_len < (size_t)content_length)
        snprintf(r->transport_error, sizeof r->transport_error, "the connection closed after %zu of the %lld "
                 "bytes of the body", body_len, content_length);
    r->body = client_xcalloc(body_len + 1, 1);
    memcpy(r->body, buf + header_len, body_len);
    r->body_len = body_len;
    free(buf);
}

/*
 * A server with --shutdown-grace 60 gets SIGTERM while one request computes (its client
 * has a small receive buffer and reads slowly, so the 10 MB answer takes a while to send)
 * and another is still uploading its body. While it drains, /readyz, new attention
 * requests and writes must get 503 shutting_down with Retry-After, and /healthz 200; the
 * computing request must get its whole 200 answer, the uploading one an answer (200 or
 * 503), not a dropped connection; then the process exits 0.
 */
/* The two requests the drain must finish, and what the tests learn on the way. */
struct drain_run {
    struct server *s;
    char *slow_text, *upload_text;
    int slow_fd, slow_sent;
    struct client_pending upload;
    double signalled;
};

/* Starts the request that computes (its answer read slowly over raw TCP) and the one that
 * uploads slowly; the test drain/in-flight-at-sigterm checks both are still running. */
static void start_in_flight(struct drain_run *d)
{
    struct server *s = d->s;
    struct test t;
    char why[256] = "";
    d->slow_text = drain_request_text();
    size_t upload_len = 400 * 1024;
    d->upload_text = client_xcalloc(upload_len + 1, 1);
    memset(d->upload_text, ' ', upload_len);
    memcpy(d->upload_text, g_tiny_request, strlen(g_tiny_request));
    static const char *const slow_writer[] = {"--limit-rate", "200K", NULL};
    struct client_request upload_rq = {.method = "POST", .path = "/v1/attention", .body = d->upload_text,
                                       .body_len = upload_len, .curl_args = slow_writer};
    d->slow_fd = raw_connect(s, 32 * 1024, why, sizeof why);
    d->slow_sent = d->slow_fd >= 0 && raw_post(d->slow_fd, "/v1/attention", d->slow_text, strlen(d->slow_text)) == 0;
    client_http_start(s->base_url, g_tmpdir, &upload_rq, &d->upload);
    client_sleep_ms(400);

    if (test_begin(&t, "drain/in-flight-at-sigterm")) {
        if (expect_true(&t, d->slow_sent, "could not send the slow request: %s", why[0] ? why : strerror(errno)))
            expect_true(&t, !raw_readable(d->slow_fd), "the slow request was answered within 0.4 s, before SIGTERM; "
                        "make it slower");
        expect_true(&t, !client_http_done(&d->upload), "the slowly uploading request ended within 0.4 s, before SIGTERM");
        test_end(&t);
    }
}

/* While draining: /readyz, new attention requests and writes get 503 shutting_down with
 * Retry-After, /healthz 200.  Returns 1 when the tiny attention request got its 503. */
static int refused_while_draining(struct drain_run *d)
{
    struct server *s = d->s;
    struct test t;
    struct client_response r;
    if (test_begin(&t, "drain/readyz-503")) {
        for (;;) {
            http_simple(s, "GET", "/readyz", &r);
            int in_flight = d->slow_sent && !raw_readable(d->slow_fd);
            if (r.status == 503) {
                expect_error(&t, &r, 503, "shutting_down", "");
                expect_true(&t, client_header(&r, "Retry-After") != NULL, "no Retry-After header");
                client_response_free(&r);
                break;
            }
            if (r.status == 200 && in_flight && client_now_seconds() - d->signalled < 3.0) {
                client_response_free(&r); /* the signal may not have been handled yet */
                client_sleep_ms(20);
                continue;
            }
            if (in_flight)
                expect_true(&t, 0, "/readyz answered %d (%s) while draining with a request in flight", r.status,
                            r.transport_error);
            else
                test_detail(&t, "    the in-flight request ended before /readyz could be asked");
            client_response_free(&r);
            break;
        }
        test_end(&t);
    }
    int tiny_refused = 0;   /* the tiny request got its 503 while draining */
    /* Whatever --filter says: drain/new-attention-503-on-io-thread looks for its 503. */
    test_begin(&t, "drain/new-attention-503");
    {
        http_text(s, "POST", "/v1/attention", g_tiny_request, &r);
        if (r.status != 0 || !raw_readable(d->slow_fd)) {
            tiny_refused = expect_error(&t, &r, 503, "shutting_down", NULL);
            expect_true(&t, client_header(&r, "Retry-After") != NULL, "no Retry-After header");
        }
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "drain/put-503")) {
        http_text(s, "PUT", "/v1/weight-sets/drained", g_tiny_set, &r);
        if (r.status != 0 || !raw_readable(d->slow_fd))
            expect_error(&t, &r, 503, "shutting_down", NULL);
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "drain/healthz-200")) {
        http_simple(s, "GET", "/healthz", &r);
        if (r.status != 0 || !raw_readable(d->slow_fd))
            expect_status(&t, &r, 200);
        client_response_free(&r);
        test_end(&t);
    }
    return tiny_refused;
}

/* The computing request gets its whole 200 answer, the uploading one an answer. */
static void in_flight_answered(struct drain_run *d)
{
    struct test t;
    struct client_response r;
    /* Read the slow answer at 16 MB/s: about 0.7 s for its 11 MB. */
    memset(&r, 0, sizeof r);
    if (d->slow_sent)
        raw_read_response(d->slow_fd, 16e6, 20.0, &r);
    if (test_begin(&t, "drain/in-flight-completes")) {
        if (expect_true(&t, d->slow_sent, "the slow request was not sent") &&
            expect_true(&t, r.transport_error[0] == '\0', "the in-flight request was cut: %s (status %d)",
                        r.transport_error, r.status) &&
            expect_status(&t, &r, 200)) {
            json_t *body = response_json(&r);
            size_t dims[3] = {DRAIN_BATCH, DRAIN_TOKENS, DRAIN_DV};
            char path[512] = "output", shape_why[1024];
            expect_true(&t, json_has_shape(json_object_get(body, "output"), dims, 3, path, sizeof path, shape_why,
                                           sizeof shape_why),
                        "%s", shape_why);
            json_decref(body);
        }
        test_end(&t);
    }
    client_response_free(&r);
    if (d->slow_fd >= 0)
        close(d->slow_fd);
    client_http_finish(&d->upload, &r);
    if (test_begin(&t, "drain/uploading-request-answered")) {
        if (expect_true(&t, r.transport_error[0] == '\0' && r.status != 0,
                        "the request that was still uploading got no answer: %s", r.transport_error) &&
            r.status != 200)
            expect_error(&t, &r, 503, "shutting_down", NULL);
        test_end(&t);
    }
    client_response_free(&r);
}

/* drain/new-attention-503-on-io-thread: read from the access log once the server exited. */
static void refused_on_io_thread(const struct server *s, int tiny_refused)
{
    struct test t;
    /* The tiny request is small enough to be answered on its I/O thread
     * (--inline-max-bytes), and was refused there; the access log says so once the server
     * has exited. */
    if (test_begin(&t, "drain/new-attention-503-on-io-thread")) {
        char want[128];
        snprintf(want, sizeof want, "access POST /v1/attention status=503 in=%zu ", strlen(g_tiny_request));
        size_t len = 0;
        char *log = client_read_file(s->stderr_path, &len);
        const char *line = log != NULL ? strstr(log, want) : NULL;
        const char *end = line != NULL ? strchr(line, '\n') : NULL;
        if (tiny_refused && expect_true(&t, line != NULL && end != NULL, "no access line \"%s...\" in %s", want,
                                        s->stderr_path)) {
            char text[512];
            snprintf(text, sizeof text, "%.*s", (int)(end - line), line);
            expect_true(&t, strstr(text, " via=inline") != NULL, "the 503 was not answered inline: %s", text);
        }
        free(log);
        test_end(&t);
    }
}

void run_drain_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {
        "server/drain", "drain/in-flight-at-sigterm", "drain/readyz-503", "drain/new-attention-503",
        "drain/put-503", "drain/healthz-200", "drain/in-flight-completes", "drain/uploading-request-answered",
        "drain/new-attention-503-on-io-thread", NULL};
    if (!any_selected(names))
        return;
    /* The grace only bounds how long the drain may take: what this test checks must not
     * depend on how fast a busy machine computes the 2 GFLOP of the slow request (5 s was
     * too short under a load of 18 on 2 cores).  The drain ends as soon as both requests
     * are answered, long before it. */
    static const char *const args[] = {"--shutdown-grace", "60", NULL};
    static const struct server_kind kind = {"drain", args, g_no_strings};
    struct server srv;
    memset(&srv, 0, sizeof srv);
    srv.kind = &kind;
    if (server_start(&srv) != 0)
        return;
    struct drain_run d = {.s = &srv};
    start_in_flight(&d);
    kill(srv.pid, SIGTERM);
    d.signalled = client_now_seconds();
    int tiny_refused = refused_while_draining(&d);
    in_flight_answered(&d);
    server_wait_exit(&srv);
    refused_on_io_thread(&srv, tiny_refused);
    free(d.slow_text);
    free(d.upload_text);
}
