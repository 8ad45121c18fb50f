/*
 * http_conn.c - the record of every open connection, and the reaper of slow
 * and vanished clients.
 *
 * libmicrohttpd's own timeout (--timeout) closes only silent connections,
 * so every connection also has a record here, made and dropped by the
 * connection-notify callback, that says which phase it is in (waiting for
 * headers, receiving a body, being answered) and since when.  A reaper
 * thread looks at the records a few times a second and closes a connection
 * whose headers have not arrived within --header-timeout, or whose body
 * averages less than --min-body-rate after that.  It closes with
 * shutdown(2), never close(2): the descriptor stays libmicrohttpd's, whose
 * next read sees end-of-file and which then closes and frees the connection
 * itself.  The record is removed under the server's lock by the notify
 * callback, which libmicrohttpd calls before it closes the descriptor, so
 * the reaper (which holds the same lock) never touches a descriptor that
 * could have been reused.  The server's work queue (work/work_queue.h) peeks
 * at the sockets of handed-over requests through http_peer_gone: a client
 * that has gone away stops its computation, and a request still queued is
 * dropped.
 */
#include <errno.h>
#include <sys/socket.h>

#include "http_private.h"
#include "core/conn_ledger.h"
#include "core/mem.h"
#include "metrics/metrics.h"

/* How often the reaper looks at the connections. */
#define HTTP_REAPER_MS 100

/* phase and now as http_conn's phase_at word */
static unsigned long long phase_word(conn_phase phase)
{
    return (unsigned long long)(compute_now() * 1e6) << 2 | (unsigned long long)phase;
}

void http_conn_set_phase(http_conn *hc, conn_phase phase)
{
    if (hc == NULL)
        return;
    /* The count first: a reaper that sees the new phase sees it reset. */
    if (phase == CONN_BODY)
        atomic_store(&hc->body_bytes, 0);
    atomic_store(&hc->phase_at, phase_word(phase));
}

int http_peer_gone(int fd)
{
    char byte;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* One look at every connection (under srv->lock). */
static void reap_once(http_server *srv)
{
    const server_config *cfg = srv->cfg;
    double now = compute_now();
    for (http_conn *hc = srv->conns; hc != NULL; hc = hc->next) {
        if (hc->shut || hc->fd < 0)
            continue;
        unsigned long long word = atomic_load(&hc->phase_at);
        conn_phase phase = (conn_phase)(word & 3);
        double elapsed = now - (double)(word >> 2) * 1e-6;
        int slow = 0;
        if (phase == CONN_WAIT_HEADERS)
            slow = elapsed > (double)cfg->header_timeout;
        else if (phase == CONN_BODY && cfg->min_body_rate > 0 &&
                 elapsed > (double)cfg->header_timeout)
            slow = (double)atomic_load(&hc->body_bytes) < (double)cfg->min_body_rate * elapsed;
        if (slow) {
            /* Counted first, so that a client that sees the close sees the count. */
            metrics_slow_closed_add();
            shutdown(hc->fd, SHUT_RDWR);
            hc->shut = 1;
        }
    }
}

void *http_reaper_main(void *arg)
{
    http_server *srv = arg;
    pthread_mutex_lock(&srv->lock);
    while (!srv->stopping) {
        struct timespec until = compute_wake_after(HTTP_REAPER_MS);
        pthread_cond_timedwait(&srv->reaper_wake, &srv->lock, &until);
        if (srv->stopping)
            break;
        reap_once(srv);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

enum MHD_Result http_accept_policy(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)cls;
    (void)addrlen;
    return conn_ledger_admits(addr) ? MHD_YES : MHD_NO;
}

void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode code)
{
    http_server *srv = cls;
    /* counted with gRPC's (core/conn_ledger.h); http_accept_policy checked the caps */
    const union MHD_ConnectionInfo *peer =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *addr = peer != NULL ? peer->client_addr : NULL;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        conn_ledger_enter(addr, 0);
    else
        conn_ledger_leave(addr);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        http_conn *hc = mem_calloc(1, sizeof *hc);
        *socket_context = hc;
        if (hc == NULL)
            return; /* served, but not watched */
        const union MHD_ConnectionInfo *info =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        hc->fd = info != NULL ? info->connect_fd : -1;
        atomic_init(&hc->phase_at, phase_word(CONN_WAIT_HEADERS));
        atomic_init(&hc->body_bytes, 0);
        pthread_mutex_lock(&srv->lock);
        hc->next = srv->conns;
        if (srv->conns != NULL)
            srv->conns->prev = hc;
        srv->conns = hc;
        pthread_mutex_unlock(&srv->lock);
        return;
    }
    http_conn *hc = *socket_context;
    if (hc == NULL)
        return;
    /* libmicrohttpd closes the descriptor after this returns: unlink first,
     * so that the reaper never shuts down a reused descriptor. */
    pthread_mutex_lock(&srv->lock);
    if (hc->prev != NULL)
        hc->prev->next = hc->next;
    else
        srv->conns = hc->next;
    if (hc->next != NULL)
        hc->next->prev = hc->prev;
    pthread_mutex_unlock(&srv->lock);
    mem_free(hc);
    *socket_context = NULL;
}
