/*
 * test_conn_ledger.c - the connections of both listeners counted together
 * (core/conn_ledger.h), and the one queue of work for the workers
 * (work/work_queue.h): its order, the words it ends an item with, a drain.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "core/conn_ledger.h"
#include "work/work_queue.h"
#include "test.h"

static struct sockaddr_in v4(const char *text)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    inet_pton(AF_INET, text, &a.sin_addr);
    return a;
}

static struct sockaddr_in6 v6(const char *text)
{
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    inet_pton(AF_INET6, text, &a.sin6_addr);
    return a;
}

/* The per-address cap holds for one address whichever listener counted its
 * connections; another address has its own; the total holds for all; an
 * IPv4-mapped IPv6 address is its IPv4 one; leaving makes room again. */
void test_conn_ledger_caps(void)
{
    conn_ledger_init(5, 2);
    struct sockaddr_in a = v4("127.0.0.2"), b = v4("127.0.0.3");
    struct sockaddr_in6 mapped = v6("::ffff:127.0.0.2"), c = v6("::1");
    const struct sockaddr *sa = (struct sockaddr *)&a, *sb = (struct sockaddr *)&b,
                          *sm = (struct sockaddr *)&mapped, *sc = (struct sockaddr *)&c;
    ASSERT_EQ(conn_ledger_enter(sa, 1), 0);        /* as HTTP's would */
    ASSERT_EQ(conn_ledger_enter(sm, 1), 0);        /* as gRPC's would, the same address */
    ASSERT_EQ(conn_ledger_open_from(sa), 2);
    ASSERT_EQ(conn_ledger_admits(sa), 0);
    ASSERT_EQ(conn_ledger_enter(sa, 1), -1);
    ASSERT_EQ(conn_ledger_open(), 2);              /* a refused one is not counted */
    ASSERT_EQ(conn_ledger_admits(sb), 1);
    ASSERT_EQ(conn_ledger_enter(sb, 1), 0);
    ASSERT_EQ(conn_ledger_enter(sb, 1), 0);
    ASSERT_EQ(conn_ledger_enter(sc, 1), 0);
    ASSERT_EQ(conn_ledger_open(), 5);
    ASSERT_EQ(conn_ledger_admits(NULL), 0);        /* the total is full */
    ASSERT_EQ(conn_ledger_enter(sc, 0), 0);        /* already accepted: counted anyway */
    ASSERT_EQ(conn_ledger_open(), 6);
    conn_ledger_leave(sc);
    conn_ledger_leave(sm);
    ASSERT_EQ(conn_ledger_open_from(sa), 1);
    ASSERT_EQ(conn_ledger_admits(sa), 1);
    conn_ledger_leave(sa);
    conn_ledger_leave(sb);
    conn_ledger_leave(sb);
    conn_ledger_leave(sc);
    ASSERT_EQ(conn_ledger_open(), 0);
    ASSERT_EQ(conn_ledger_open_from(sa), 0);
    conn_ledger_init(1, 0);                        /* no per-address cap */
    ASSERT_EQ(conn_ledger_enter(sa, 1), 0);
    ASSERT_EQ(conn_ledger_enter(sb, 1), -1);
    conn_ledger_init(8192, 512);
}

/* An item of the tests below: what happened to it. */
typedef struct test_item {
    work_item item;
    compute_token token;
    int ran, done, refused, order;
    char code[40];
} test_item;

static pthread_mutex_t items_lock = PTHREAD_MUTEX_INITIALIZER;
static int next_order;
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static int gate_open = 1;

static void item_run(work_item *it)
{
    test_item *t = (test_item *)it;
    pthread_mutex_lock(&gate_lock);
    while (!gate_open)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
    pthread_mutex_lock(&items_lock);
    t->ran = 1;
    t->order = next_order++;
    pthread_mutex_unlock(&items_lock);
}

static void item_done(work_item *it)
{
    test_item *t = (test_item *)it;
    pthread_mutex_lock(&items_lock);
    t->done = 1;
    pthread_mutex_unlock(&items_lock);
}

static void item_refuse(work_item *it, const attn_error *err)
{
    test_item *t = (test_item *)it;
    pthread_mutex_lock(&items_lock);
    t->refused = 1;
    snprintf(t->code, sizeof t->code, "%s", err->code);
    pthread_mutex_unlock(&items_lock);
}

static const work_ops test_ops = {item_run, item_done, item_refuse, NULL};

static void item_init(test_item *t, const void *owner, double deadline_in)
{
    memset(t, 0, sizeof *t);
    t->token.deadline = compute_now() + deadline_in;
    atomic_init(&t->token.reason, COMPUTE_RUNNING);
    t->item = (work_item){.ops = &test_ops, .token = &t->token, .owner = owner};
}

static void gate(int open)
{
    pthread_mutex_lock(&gate_lock);
    gate_open = open;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

/* 1 when every item of ts (n) has ended, run and done or refused, within 10 s. */
static int all_ended(test_item *ts, int n)
{
    for (int tries = 0; tries < 1000; tries++) {
        int ended = 0;
        pthread_mutex_lock(&items_lock);
        for (int i = 0; i < n; i++)
            ended += ts[i].done || ts[i].refused;
        pthread_mutex_unlock(&items_lock);
        if (ended == n)
            return 1;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

/* With one worker, items run in the order they came; an item whose deadline
 * passes while it waits, and one that waits past --queue-wait-ms, are ended
 * unrun with the queue's words; a drain ends an owner's queued items only. */
void test_work_queue_order_and_words(void)
{
    static const char owner_a = 'a', owner_b = 'b';
    ASSERT_EQ(work_queue_start(1, 300), 0);
    ASSERT_EQ(work_queue_workers(), 1);
    test_item ts[4];
    gate(0); /* the worker holds the first item until the rest are queued */
    item_init(&ts[0], &owner_a, 60);
    item_init(&ts[1], &owner_a, 60);
    item_init(&ts[2], &owner_a, 60);
    ASSERT_EQ(work_queue_push(&ts[0].item), 0);
    ASSERT_EQ(work_queue_push(&ts[1].item), 0);
    ASSERT_EQ(work_queue_push(&ts[2].item), 0);
    gate(1);
    ASSERT(all_ended(ts, 3));
    for (int i = 0; i < 3; i++) {
        ASSERT(ts[i].ran && ts[i].done && !ts[i].refused);
        ASSERT_EQ(ts[i].order, i);
    }
    gate(0);
    item_init(&ts[0], &owner_a, 60);   /* holds the worker */
    item_init(&ts[1], &owner_a, 0.05); /* its deadline passes while it waits */
    item_init(&ts[2], &owner_a, 60);   /* waits past 300 ms */
    ASSERT_EQ(work_queue_push(&ts[0].item), 0);
    ASSERT_EQ(work_queue_push(&ts[1].item), 0);
    ASSERT_EQ(work_queue_push(&ts[2].item), 0);
    ASSERT(all_ended(&ts[1], 2));
    gate(1);
    ASSERT(all_ended(ts, 1));
    ASSERT(ts[1].refused && !ts[1].ran);
    ASSERT_STR_EQ(ts[1].code, "deadline_exceeded");
    ASSERT(ts[2].refused && !ts[2].ran);
    ASSERT_STR_EQ(ts[2].code, "overloaded");
    gate(0);
    item_init(&ts[3], &owner_b, 60);   /* owner b's holds the worker */
    item_init(&ts[0], &owner_a, 60);
    item_init(&ts[1], &owner_a, 60);
    ASSERT_EQ(work_queue_push(&ts[3].item), 0);
    for (int tries = 0; tries < 1000 && work_queue_length() != 0; tries++) {
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);   /* until the worker has taken it */
    }
    ASSERT_EQ(work_queue_push(&ts[0].item), 0);
    ASSERT_EQ(work_queue_push(&ts[1].item), 0);
    attn_error err;
    error_set(&err, ERR_UNAVAILABLE, "shutting_down", NULL, "Shutting down.");
    work_queue_drain(&owner_a, &err);  /* owner a has nothing running: returns at once */
    ASSERT(ts[0].refused && !ts[0].ran);
    ASSERT_STR_EQ(ts[0].code, "shutting_down");
    ASSERT(ts[1].refused && !ts[1].ran);
    ASSERT(!ts[3].done);
    gate(1);
    ASSERT(all_ended(&ts[3], 1));
    ASSERT(ts[3].ran && ts[3].done);
    work_queue_stop();
    ASSERT_EQ(work_queue_workers(), 0);
    item_init(&ts[0], &owner_a, 60);
    ASSERT_EQ(work_queue_push(&ts[0].item), -1); /* stopped: nothing is queued */
}
