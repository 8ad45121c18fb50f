/*
 * test_budget.c - the process memory budget and each client address's share
 * of it (budget.h, budget_client.h).
 */
#include <arpa/inet.h>
#include <netinet/in.h>

#include "core/budget.h"
#include "core/budget_client.h"
#include "test.h"

static struct sockaddr_in ipv4(const char *text)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    inet_pton(AF_INET, text, &a.sin_addr);
    return a;
}

static struct sockaddr_in6 ipv6(const char *text)
{
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    inet_pton(AF_INET6, text, &a.sin6_addr);
    return a;
}

/* One address holds at most its share; another still gets the rest. */
void test_budget_client_share(void)
{
    budget_init(1000);
    budget_client_init(50);
    ASSERT_EQ(budget_client_cap(), 500);
    struct sockaddr_in a = ipv4("127.0.0.2"), b = ipv4("127.0.0.1");
    budget_client *crawler = budget_client_get((struct sockaddr *)&a);
    budget_client *again = budget_client_get((struct sockaddr *)&a);
    budget_client *other = budget_client_get((struct sockaddr *)&b);
    ASSERT(crawler != NULL && other != NULL);
    ASSERT(crawler == again); /* every connection of one address shares one record */
    ASSERT(crawler != other);
    ASSERT_EQ(budget_client_reserve(crawler, 300), 0);
    ASSERT_EQ(budget_client_reserve(again, 200), 0);
    ASSERT_EQ(budget_client_reserve(crawler, 1), -1); /* its share is full */
    /* The process budget holds those 500 and has 500 left. */
    ASSERT_EQ(budget_reserve(501), -1);
    ASSERT_EQ(budget_reserve(500), 0);
    budget_release(500);
    ASSERT_EQ(budget_client_reserve(other, 500), 0);
    ASSERT_EQ(budget_client_reserve(other, 1), -1);  /* the budget is full */
    ASSERT_EQ(budget_client_held(crawler), 500);
    budget_client_release(crawler, 200);
    ASSERT_EQ(budget_client_reserve(crawler, 201), -1); /* past its share again */
    ASSERT_EQ(budget_client_reserve(crawler, 200), 0);
    budget_client_release(crawler, 500);
    budget_client_release(other, 500);
    ASSERT_EQ(budget_reserve(1000), 0); /* everything was given back */
    budget_release(1000);
    budget_client_put(crawler);
    budget_client_put(again);
    budget_client_put(other);
    ASSERT_EQ(budget_client_reserve(NULL, 700), 0); /* no record: the budget alone */
    budget_client_release(NULL, 700);
    budget_init(0);
    budget_client_init(50);
    ASSERT_EQ(budget_client_cap(), 0);
}

/* An IPv6 client is its /64; an IPv4 address mapped into IPv6 is that address. */
void test_budget_client_keys(void)
{
    budget_init(1000);
    budget_client_init(10);
    struct sockaddr_in6 x = ipv6("2001:db8:1:2::1"), y = ipv6("2001:db8:1:2:ffff::9"),
                        z = ipv6("2001:db8:1:3::1"), mapped = ipv6("::ffff:127.0.0.2");
    struct sockaddr_in v4 = ipv4("127.0.0.2");
    budget_client *cx = budget_client_get((struct sockaddr *)&x);
    budget_client *cy = budget_client_get((struct sockaddr *)&y);
    budget_client *cz = budget_client_get((struct sockaddr *)&z);
    budget_client *cm = budget_client_get((struct sockaddr *)&mapped);
    budget_client *c4 = budget_client_get((struct sockaddr *)&v4);
    ASSERT(cx == cy);
    ASSERT(cx != cz);
    ASSERT(cm == c4);
    ASSERT_EQ(budget_client_reserve(cx, 100), 0);
    ASSERT_EQ(budget_client_reserve(cy, 1), -1);
    ASSERT_EQ(budget_client_reserve(cz, 100), 0);
    budget_client_release(cx, 100);
    budget_client_release(cz, 100);
    budget_client_put(cx);
    budget_client_put(cy);
    budget_client_put(cz);
    budget_client_put(cm);
    budget_client_put(c4);
    budget_init(0);
    budget_client_init(50);
}
