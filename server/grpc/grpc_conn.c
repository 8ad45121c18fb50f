/*
 * grpc_conn.c - the gRPC port's connections, and the calls that wait for
 * their message: the limits HTTP holds on a connection and a body, held on
 * gRPC (docs/security.md has the table of which mechanism holds what).
 *
 * Connections.  Without TLS the front-end listens and accepts itself, and
 * hands each connection to gRPC's core (grpc_server_add_channel_from_fd), so
 * that a connection is counted in the server's ledger (core/conn_ledger.h)
 * with HTTP's before gRPC sees a byte: --max-connections and
 * --max-connections-per-ip hold across both ports, and a refused connection
 * is closed at once.  gRPC's core then owns the descriptor and closes it when
 * the connection ends, and tells nobody: a connection is taken as open while
 * its descriptor still names the socket accepted (the same inode), which the
 * sweep reads.  gRPC's core names such a call's peer "fd:N", by which a call
 * finds its connection.  Under TLS gRPC's core must accept (it can adopt only
 * a plain connection): the caps are gRPC's channel arguments alone then.
 *
 * Waiting calls.  gRPC's core gives a message only whole, so the bytes of one
 * on its way are read from the kernel: TCP_INFO's bytes received on the
 * connection.  While a call waits for its message it is in the front's list;
 * every SWEEP_MS the polling thread (a) ends a call that has waited past
 * --header-timeout while its connection received fewer than --min-body-rate
 * bytes a second since the sweep first saw it (with no rate set: nothing for
 * --timeout), as HTTP closes a slow body, and (b) reserves the bytes each
 * connection has received beyond the messages given and their framing, in
 * the budget through its client's share, as HTTP reserves a body while it
 * arrives; when the share or the budget is full, the connection's waiting
 * calls end with RESOURCE_EXHAUSTED.  The kernel is asked only by the sweep,
 * never on a call's own path.  A message that arrives reserves its own peak
 * (gconn_admit_message) before protobuf-c unpacks it, and gives it back with
 * its answer.
 */
#include "grpc_front_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <netinet/in.h>
#include <grpc/support/alloc.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_bytes_received, which glibc's lacks */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/conn_ledger.h"
#include "core/mem.h"
#include "metrics/metrics.h"

typedef struct gconn {
    struct gconn *next;
    int fd;
    unsigned long ino;
    struct sockaddr_storage addr;
    budget_client *client;      /* a reference of its own */
    unsigned long long given;   /* bytes received that belong to messages given and their
                                   framing (an allowance), never more than received */
    size_t held;                /* reserved for bytes received beyond `given` */
    long waiting;               /* its calls waiting for a message */
    int full;                   /* the sweep could not reserve what it received */
} gconn;

struct gconn_table {
    grpc_front *front;
    grpc_server_credentials *creds;
    int listen_fd, port;
    int wake[2];                /* written to stop the acceptor */
    pthread_t acceptor;
    int started;
    pthread_mutex_t lock;       /* the list */
    gconn *list;
};

/* The socket inode of fd, 0 when fd is not open. */
static unsigned long fd_inode(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? (unsigned long)st.st_ino : 0;
}

/* Forgets the connections whose descriptor no longer names their socket;
 * under t->lock. */
static void forget_closed(gconn_table *t)
{
    for (gconn **at = &t->list; *at != NULL;) {
        gconn *k = *at;
        if (fd_inode(k->fd) == k->ino) {
            at = &k->next;
            continue;
        }
        *at = k->next;
        conn_ledger_leave((struct sockaddr *)&k->addr);
        budget_client_release(k->client, k->held);
        budget_client_put(k->client);
        free(k);
    }
}

/* The connection of fd with its socket still open; under t->lock. */
static gconn *find(gconn_table *t, int fd, unsigned long ino)
{
    for (gconn *k = t->list; k != NULL; k = k->next)
        if (k->fd == fd && k->ino == ino)
            return k;
    return NULL;
}

/* Takes the connection fd from addr, or closes it when a cap is full. */
static void take(gconn_table *t, int fd, const struct sockaddr_storage *addr)
{
    const struct sockaddr *sa = (const struct sockaddr *)addr;
    if (!conn_ledger_admits(sa)) { /* perhaps only until gRPC's closed ones are counted */
        pthread_mutex_lock(&t->lock);
        forget_closed(t);
        pthread_mutex_unlock(&t->lock);
    }
    if (conn_ledger_enter(sa, 1) != 0) { /* a cap is full: closed before a byte is read */
        close(fd);
        return;
    }
    gconn *k = calloc(1, sizeof *k);
    if (k == NULL) {
        conn_ledger_leave(sa);
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    k->fd = fd;
    k->ino = fd_inode(fd);
    k->addr = *addr;
    k->client = budget_client_get(sa);
    pthread_mutex_lock(&t->lock);
    k->next = t->list;
    t->list = k;
    pthread_mutex_unlock(&t->lock);
    grpc_server_add_channel_from_fd(t->front->server, fd, t->creds);
}

static void *acceptor_main(void *arg)
{
    gconn_table *t = arg;
    for (;;) {
        struct pollfd p[2] = {{t->listen_fd, POLLIN, 0}, {t->wake[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents != 0)
            break;
        struct sockaddr_storage addr;
        socklen_t len = sizeof addr;
        memset(&addr, 0, sizeof addr);
        int fd = accept4(t->listen_fd, (struct sockaddr *)&addr, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            take(t, fd, &addr);
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* out of descriptors: wait for some to close rather than spin */
            poll(&p[1], 1, 100);
        }
    }
    return NULL;
}

gconn_table *gconn_listen(grpc_front *front, attn_error *err)
{
    const server_config *cfg = front->cfg;
    gconn_table *t = calloc(1, sizeof *t);
    if (t == NULL) {
        error_nomem(err);
        return NULL;
    }
    t->front = front;
    t->listen_fd = t->wake[0] = t->wake[1] = -1;
    pthread_mutex_init(&t->lock, NULL);
    /* the host as HTTP's listener reads it (getaddrinfo: an address or a name), its
     * first address */
    long port = cfg->grpc_port > 0 ? cfg->grpc_port : 0;
    char port_text[24];
    snprintf(port_text, sizeof port_text, "%ld", port);
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len = 0;
    if (getaddrinfo(cfg->host, port_text, &hints, &ai) == 0 && ai != NULL &&
        ai->ai_addrlen <= sizeof ss) {
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        len = (socklen_t)ai->ai_addrlen;
    }
    if (ai != NULL)
        freeaddrinfo(ai);
    int one = 1;
    if (len != 0 && (t->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0 &&
        setsockopt(t->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(t->listen_fd, (struct sockaddr *)&ss, len) == 0 && listen(t->listen_fd, 1024) == 0 &&
        getsockname(t->listen_fd, (struct sockaddr *)&ss, &len) == 0 && pipe(t->wake) == 0) {
        t->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
        t->creds = grpc_insecure_server_credentials_create();
        if (pthread_create(&t->acceptor, NULL, acceptor_main, t) == 0) {
            t->started = 1;
            return t;
        }
    }
    gconn_listen_error(cfg, err);
    gconn_stop(t);
    return NULL;
}

void gconn_listen_address(const server_config *cfg, char *out, size_t size)
{
    int v6 = strchr(cfg->host, ':') != NULL;
    snprintf(out, size, "%s%s%s:%ld", v6 ? "[" : "", cfg->host, v6 ? "]" : "",
             cfg->grpc_port > 0 ? cfg->grpc_port : 0);
}

void gconn_listen_error(const server_config *cfg, attn_error *err)
{
    char addr[300];
    gconn_listen_address(cfg, addr, sizeof addr);
    error_set(err, ERR_INTERNAL, "grpc_port", NULL, "Cannot listen for gRPC on %s (in use, or not "
              "an address of this machine); choose another --grpc-port, or 0 to serve HTTP "
              "only.", addr);
}

int gconn_port(const gconn_table *t)
{
    return t->port;
}

void gconn_stop_accepting(gconn_table *t)
{
    if (t == NULL)
        return;
    if (t->started) {
        if (write(t->wake[1], "x", 1) < 0) {
            /* the pipe is ours and empty: cannot fail */
        }
        pthread_join(t->acceptor, NULL);
        t->started = 0;
    }
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    t->listen_fd = -1;
}

void gconn_stop(gconn_table *t)
{
    if (t == NULL)
        return;
    gconn_stop_accepting(t);
    for (int i = 0; i < 2; i++)
        if (t->wake[i] >= 0)
            close(t->wake[i]);
    if (t->creds != NULL)
        grpc_server_credentials_release(t->creds);
    /* gRPC's core has closed every connection by now (the server is destroyed after) */
    while (t->list != NULL) {
        gconn *k = t->list;
        t->list = k->next;
        conn_ledger_leave((struct sockaddr *)&k->addr);
        budget_client_release(k->client, k->held);
        budget_client_put(k->client);
        free(k);
    }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* The bytes received on the connection of fd (socket ino) so far; 0 when it
 * is gone. */
static unsigned long long conn_bytes(int fd, unsigned long ino)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (fd < 0 || fd_inode(fd) != ino ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return 0;
    return (unsigned long long)ti.tcpi_bytes_received;
}

/* Parses gRPC's peer name "ipv4:A:PORT" or "ipv6:[A]:PORT" into addr; 0, or -1. */
static int peer_address(const char *peer, struct sockaddr_storage *addr)
{
    char host[64];
    memset(addr, 0, sizeof *addr);
    if (!strncmp(peer, "ipv4:", 5)) {
        size_t n = strcspn(peer + 5, ":");
        snprintf(host, sizeof host, "%.*s", (int)n, peer + 5);
        struct sockaddr_in *a = (struct sockaddr_in *)addr;
        a->sin_family = AF_INET;
        return inet_pton(AF_INET, host, &a->sin_addr) == 1 ? 0 : -1;
    }
    if (!strncmp(peer, "ipv6:[", 6)) {
        size_t n = strcspn(peer + 6, "]");
        snprintf(host, sizeof host, "%.*s", (int)n, peer + 6);
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)addr;
        a->sin6_family = AF_INET6;
        return inet_pton(AF_INET6, host, &a->sin6_addr) == 1 ? 0 : -1;
    }
    return -1;
}

int gconn_call_begin(gcall *c)
{
    gconn_table *t = c->front->conns;
    char *peer = grpc_call_get_peer(c->call);
    struct sockaddr_storage addr;
    int known = 0;
    c->conn_fd = -1;
    if (t != NULL && peer != NULL && !strncmp(peer, "fd:", 3)) {
        int fd = atoi(peer + 3);
        unsigned long ino = fd_inode(fd);
        pthread_mutex_lock(&t->lock);
        gconn *k = find(t, fd, ino);
        if (k != NULL) {
            c->conn_fd = fd;
            c->conn_ino = ino;
            addr = k->addr;
            known = 1;
        }
        pthread_mutex_unlock(&t->lock);
    } else if (peer != NULL) {
        known = peer_address(peer, &addr) == 0;
    }
    gpr_free(peer);
    c->client = budget_client_get(known ? (struct sockaddr *)&addr : NULL);
    if (budget_client_reserve(c->client, GRPC_CALL_MEMORY) != 0)
        return 0;
    c->call_reserved = GRPC_CALL_MEMORY;
    return 1;
}

const char *gconn_client(const gcall *c, char *out, size_t size)
{
    out[0] = '\0';
    gconn_table *t = c->front->conns;
    struct sockaddr_storage addr;
    int known = 0;
    if (t != NULL && c->conn_fd >= 0) {
        pthread_mutex_lock(&t->lock);
        gconn *k = find(t, c->conn_fd, c->conn_ino);
        if (k != NULL)
            addr = k->addr, known = 1;
        pthread_mutex_unlock(&t->lock);
    } else {
        char *peer = grpc_call_get_peer(c->call);
        known = peer != NULL && peer_address(peer, &addr) == 0;
        gpr_free(peer);
    }
    if (known && addr.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&addr)->sin_addr, out, (socklen_t)size);
    else if (known && addr.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&addr)->sin6_addr, out, (socklen_t)size);
    return out;
}

void gconn_wait(gcall *c)
{
    grpc_front *front = c->front;
    if (c->waiting)
        return;
    c->waiting = 1;
    c->wait_since = compute_now();
    c->wait_from = 0; /* its connection's bytes are first read by the sweep */
    c->wait_prev = NULL;
    c->wait_next = front->waiting;
    if (front->waiting != NULL)
        front->waiting->wait_prev = c;
    front->waiting = c;
    front->n_waiting++;
    gconn_table *t = front->conns;
    if (t != NULL && c->conn_fd >= 0) {
        pthread_mutex_lock(&t->lock);
        gconn *k = find(t, c->conn_fd, c->conn_ino);
        if (k != NULL) /* what came before this call began counts too: gRPC's core may
                        * have read much of its message before the call reached us */
            k->waiting++;
        pthread_mutex_unlock(&t->lock);
    }
}

void gconn_unwait(gcall *c)
{
    grpc_front *front = c->front;
    if (!c->waiting)
        return;
    c->waiting = 0;
    if (c->wait_prev != NULL)
        c->wait_prev->wait_next = c->wait_next;
    else
        front->waiting = c->wait_next;
    if (c->wait_next != NULL)
        c->wait_next->wait_prev = c->wait_prev;
    c->wait_prev = c->wait_next = NULL;
    front->n_waiting--;
    gconn_table *t = front->conns;
    if (t != NULL && c->conn_fd >= 0) {
        pthread_mutex_lock(&t->lock);
        gconn *k = find(t, c->conn_fd, c->conn_ino);
        if (k != NULL && --k->waiting <= 0) { /* nothing on its way any more */
            k->waiting = 0;
            budget_client_release(k->client, k->held);
            k->held = 0;
        }
        pthread_mutex_unlock(&t->lock);
    }
}

/* What a message of len bytes may hold at its peak once it has come: the
 * message itself, protobuf-c's unpacked form of it (bytes fields are copied),
 * which grpc_infer_answer holds to grpc_infer_unpack_bound, and the typed
 * contents written out for v2; the computation reserves its own (admission). */
static size_t message_peak(size_t len)
{
    return 2 * len + grpc_infer_unpack_bound(len);
}

/* The words of a message, come or on its way, that the budget cannot hold. */
#define NO_ROOM_FOR_MESSAGE                                                                 \
    "The server's memory budget (--max-memory), or this client's share of it "             \
    "(--max-memory-share), could not hold this message now; retry shortly."

/* The bytes a message's call brings beside the message on the wire (its
 * HEADERS, the 5-byte prefix, DATA frames' headers, the client's window
 * updates), counted as given with it so that a busy connection's framing never
 * adds up to bytes "on their way"; the DATA frames' 9 bytes a 16 KiB frame are
 * within len / 1024 more. */
#define GRPC_FRAMING_ALLOWANCE 512

int gconn_admit_message(gcall *c, grpc_answer *a)
{
    gconn_table *t = c->front->conns;
    if (t != NULL && c->conn_fd >= 0) { /* its bytes are the message's own now */
        pthread_mutex_lock(&t->lock);
        gconn *k = find(t, c->conn_fd, c->conn_ino);
        if (k != NULL) {
            size_t back = c->in_len < k->held ? c->in_len : k->held;
            budget_client_release(k->client, back);
            k->held -= back;
            /* the framing came with it too (the sweep never lets `given` pass
             * what was received, so an allowance too large hides nothing later) */
            k->given += c->in_len + GRPC_FRAMING_ALLOWANCE + c->in_len / 1024;
        }
        pthread_mutex_unlock(&t->lock);
    }
    size_t need = c->in_len != 0 ? message_peak(c->in_len) : 0;
    if (need == 0 || budget_client_reserve(c->client, need) == 0) {
        c->reserved = need;
        return 0;
    }
    grpc_answer_error(a, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", NO_ROOM_FOR_MESSAGE);
    a->retry_after = 1;
    a->http_status = 503;
    a->route = ROUTE_V2_INFER;
    return -1;
}

void gconn_release_message(gcall *c)
{
    if (c->reserved == 0)
        return;
    budget_client_release(c->client, c->reserved);
    if (c->reserved >= MEM_GIVE_BACK_FROM)
        c->large = 1; /* its memory is given back when the call is freed (gcall_free) */
    c->reserved = 0;
}

/* Ends waiting call c with code and words (logged as HTTP's twin status). */
static void end_waiting(gcall *c, grpc_status_code code, int http_status, const char *words)
{
    gconn_unwait(c);
    gcall_log(c, code, http_status, grpc_method_route(c->method), compute_now() - c->started, 0,
              NULL);
    metrics_observe(grpc_method_route(c->method), http_status, compute_now() - c->started, 0, 0);
    c->logged = 1;
    grpc_call_cancel_with_status(c->call, code, words, NULL);
}

void gconn_sweep(grpc_front *front)
{
    const server_config *cfg = front->cfg;
    double now = compute_now();
    front->swept = now;
    gconn_table *t = front->conns;
    if (t != NULL) {
        pthread_mutex_lock(&t->lock);
        forget_closed(t);
        /* (b) the bytes on their way, in the budget through the client's share */
        for (gconn *k = t->list; k != NULL; k = k->next) {
            if (k->waiting == 0)
                continue;
            unsigned long long now_bytes = conn_bytes(k->fd, k->ino);
            if (k->given > now_bytes)
                k->given = now_bytes;
            size_t owed = (size_t)(now_bytes - k->given);
            if (owed <= k->held)
                continue;
            if (budget_client_reserve(k->client, owed - k->held) == 0) {
                k->held = owed;
                continue;
            }
            k->full = 1; /* its waiting calls end below */
        }
        pthread_mutex_unlock(&t->lock);
    }
    int ended = 0;
    for (gcall *c = front->waiting, *next; c != NULL; c = next) {
        next = c->wait_next;
        int full = 0;
        unsigned long long bytes = 0;
        if (t != NULL && c->conn_fd >= 0) {
            pthread_mutex_lock(&t->lock);
            gconn *k = find(t, c->conn_fd, c->conn_ino);
            full = k != NULL && k->full;
            pthread_mutex_unlock(&t->lock);
            bytes = conn_bytes(c->conn_fd, c->conn_ino);
        }
        if (c->wait_from == 0) { /* the rate is measured from its first sweep */
            c->wait_from = now;
            c->wait_bytes = bytes;
        }
        if (full) {
            ended = 1;
            end_waiting(c, GRPC_STATUS_RESOURCE_EXHAUSTED, 503, NO_ROOM_FOR_MESSAGE);
            continue;
        }
        double waited = now - c->wait_since;
        if (waited <= (double)cfg->header_timeout)
            continue;
        int slow;
        if (c->conn_fd < 0) /* no view of its bytes (TLS): the message within --timeout */
            slow = waited > (double)cfg->header_timeout + (double)cfg->timeout;
        else if (cfg->min_body_rate > 0 && !c->stream_later)
            slow = (double)(bytes - c->wait_bytes) < (double)cfg->min_body_rate * (now - c->wait_from);
        else /* a stream between its requests, or no rate set: idle past --timeout */
            slow = bytes == c->wait_bytes && waited > (double)cfg->timeout;
        if (slow) {
            ended = 1;
            metrics_slow_closed_add();
            end_waiting(c, GRPC_STATUS_DEADLINE_EXCEEDED, 408,
                        c->stream_later
                            ? "The stream sent no request for --timeout seconds; it is closed."
                            : "The request message arrived slower than --min-body-rate once "
                              "--header-timeout had passed (or not at all); send it at once.");
        }
    }
    if (ended) /* what the ended calls had buffered goes back, as after a large HTTP body */
        mem_give_back();
    if (t != NULL) { /* a connection marked full counts again from its next call */
        pthread_mutex_lock(&t->lock);
        for (gconn *k = t->list; k != NULL; k = k->next)
            k->full = 0;
        pthread_mutex_unlock(&t->lock);
    }
}
