/*
 * itest_restart.c - persistence: stored sets survive SIGTERM and a new start on the same
 * data directory bit for bit; damaged files are not served and move to quarantine/;
 * an interrupted write is removed.
 */
#include "itest.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <unistd.h>

/* The name of a temporary file that a crashed server on this host left:
 * ".tmp.HOST.PID.1" with this host's name as the server writes it and a pid
 * that no process has now. */
static void crashed_tmp_name(char *out, size_t len)
{
    char host[256] = "", label[64];
    gethostname(host, sizeof host - 1);
    size_t j = 0;
    for (size_t i = 0; host[i] && j + 1 < sizeof label; i++)
        label[j++] = (isalnum((unsigned char)host[i]) || host[i] == '-') ? host[i] : '-';
    label[j] = '\0';
    long pid = 4000000;
    while (pid > 1000 && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH))
        pid -= 7919;
    snprintf(out, len, ".tmp.%s.%ld.1", label, pid);
}

/* Copies a file; returns 0 or -1. */
static int copy_file(const char *from, const char *to)
{
    size_t len;
    char *data = client_read_file(from, &len);
    int rc = data != NULL ? client_write_file(to, data, len) : -1;
    free(data);
    return rc;
}

/* Flips one bit of the byte at offset of a file; returns 0 or -1. */
static int flip_byte(const char *path, long long offset)
{
    size_t len;
    char *data = client_read_file(path, &len);
    if (data == NULL || offset < 0 || (size_t)offset >= len) {
        free(data);
        return -1;
    }
    data[offset] ^= 0x10;
    int rc = client_write_file(path, data, len);
    free(data);
    return rc;
}

/* Returns 1 when dir has an entry that begins with prefix. */
static int dir_has_prefix(const char *dir, const char *prefix)
{
    size_t count;
    char **names = dir_entries(dir, &count);
    int found = 0;
    for (size_t i = 0; i < count && !found; i++)
        found = strncmp(names[i], prefix, strlen(prefix)) == 0;
    free_name_list(names);
    return found;
}

/* The sets stored before the restart and kept, and those whose files are damaged. */
static const char *const g_kept_sets[] = {"keep-plain", "keep-outin", "keep-random"};
static const char *const g_damaged_files[] = {"victim-flip.wset", "victim-trunc.wset", "victim-header.wset",
                                              "garbage.wset", "impostor.wset"};
#define KEEP_COUNT (sizeof g_kept_sets / sizeof g_kept_sets[0])
#define DAMAGED_COUNT (sizeof g_damaged_files / sizeof g_damaged_files[0])

/* What the steps before the restart leave for the tests after it. */
struct restart_state {
    const char *dir;           /* the data directory both servers use */
    char leftover[128];        /* the name of the interrupted write left there */
    json_t *saved[KEEP_COUNT]; /* GET of each kept set before the restart */
    json_t *named_req;         /* attention by name of keep-random, and its answer */
    json_t *named_answer;
    int dot_tmp_stored;        /* PUT .tmp.keep answered 201 */
    json_t *random_set;
    char *random_text;
};

/* The step restart/stored-before: stores the kept sets and the victims on the first server
 * (it runs, unreported, when --filter leaves it out: the tests after the restart need it). */
static void restart_store_sets(struct restart_state *st, struct server *first)
{
    struct test t;
    struct client_response r;
    uint64_t rng = RANDOM_SEED + 4242u;
    st->random_set = random_weight_set(&rng, 4, 4, 4, 4, 3, 1, 1, 0, 2);
    st->random_text = json_dumps(st->random_set, JSON_COMPACT);
    const char *texts[KEEP_COUNT] = {g_awkward_set, g_out_in_set, st->random_text};
    int selected = test_begin(&t, "restart/stored-before");
    for (size_t i = 0; i < KEEP_COUNT; i++) {
        json_decref(put_set_text(&t, first, g_kept_sets[i], texts[i], 201));
        st->saved[i] = get_set(&t, first, g_kept_sets[i], 200);
    }
    static const char *const victims[] = {"victim-flip", "victim-trunc", "victim-header"};
    for (size_t i = 0; i < 3; i++)
        json_decref(put_set_text(&t, first, victims[i], st->random_text, 201));
    /* A name that begins like the store's temporary files. */
    http_text(first, "PUT", "/v1/weight-sets/.tmp.keep", g_tiny_set, &r);
    st->dot_tmp_stored = r.status == 201;
    expect_true(&t, r.status == 201 || r.status == 400, "PUT .tmp.keep: status %d, expected 201 or 400", r.status);
    client_response_free(&r);
    st->named_req = json_object();
    double *x = random_values(&rng, 5 * 4, 1.0, 0);
    json_object_set_new(st->named_req, "x", json_matrix(x, 5, 4, 0));
    json_object_set_new(st->named_req, "weights", json_string("keep-random"));
    free(x);
    http_post_json(first, "/v1/attention", st->named_req, &r);
    if (expect_status(&t, &r, 200))
        st->named_answer = response_json(&r);
    client_response_free(&r);
    if (selected)
        test_end(&t);
}

/* The step restart/damage-files, while no server runs. */
static void restart_damage_files(const struct restart_state *st)
{
    struct test t;
    const char *dir = st->dir;
    int selected = test_begin(&t, "restart/damage-files");
    char path[PATH_MAX], other[PATH_MAX];
    snprintf(path, sizeof path, "%s/victim-flip.wset", dir);
    long long size = file_size(path);
    expect_true(&t, size > 16 && flip_byte(path, size / 2) == 0, "cannot flip a byte of %s", path);
    snprintf(path, sizeof path, "%s/victim-trunc.wset", dir);
    size = file_size(path);
    expect_true(&t, size > 16 && truncate(path, (off_t)(size - 8)) == 0, "cannot truncate %s", path);
    snprintf(path, sizeof path, "%s/victim-header.wset", dir);
    expect_true(&t, truncate(path, 40) == 0, "cannot truncate %s", path);
    snprintf(path, sizeof path, "%s/garbage.wset", dir);
    expect_true(&t, client_write_file(path, "not a weight set\n", 17) == 0, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/keep-random.wset", dir);
    snprintf(other, sizeof other, "%s/impostor.wset", dir);
    expect_true(&t, copy_file(path, other) == 0, "cannot copy %s to %s", path, other);
    snprintf(path, sizeof path, "%s/%s", dir, st->leftover);
    expect_true(&t, client_write_file(path, "ATTNWSET half", 13) == 0, "cannot write %s", path);
    if (selected)
        test_end(&t);

}

/* The tests of the second server, on the same directory. */
static void restart_check_after(const struct restart_state *st, struct server *s)
{
    struct test t;
    struct client_response r;
    const char *dir = st->dir;
    char path[PATH_MAX];
    if (test_begin(&t, "restart/sets-identical")) {
        /* Exactly the kept sets (and .tmp.keep, whose fate its own test reports). */
        json_t *list = get_set_list(&t, s);
        for (size_t i = 0; i < json_array_size(list); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(list, i), "name"));
            int known = name != NULL && strcmp(name, ".tmp.keep") == 0;
            for (size_t k = 0; k < KEEP_COUNT && !known; k++)
                known = name != NULL && strcmp(name, g_kept_sets[k]) == 0;
            expect_true(&t, known, "the list has %s, which was not stored or is damaged", name ? name : "(no name)");
        }
        for (size_t i = 0; i < KEEP_COUNT; i++) {
            expect_true(&t, list_find(list, g_kept_sets[i]) != NULL, "the list lacks %s", g_kept_sets[i]);
            json_t *body = get_set(&t, s, g_kept_sets[i], 200);
            if (body != NULL && st->saved[i] != NULL)
                expect_same(&t, body, st->saved[i], 1, g_kept_sets[i]);
            json_decref(body);
        }
        json_decref(list);
        test_end(&t);
    }
    if (test_begin(&t, "restart/usable-by-name")) {
        http_post_json(s, "/v1/attention", st->named_req, &r);
        if (expect_status(&t, &r, 200) && expect_true(&t, st->named_answer != NULL, "no answer before the restart")) {
            json_t *body = response_json(&r);
            expect_same_answer(&t, body, st->named_answer);
            json_decref(body);
        }
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-not-served")) {
        for (size_t i = 0; i < DAMAGED_COUNT; i++) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(strlen(g_damaged_files[i]) - 5), g_damaged_files[i]);
            json_decref(get_set(&t, s, name, 404));
        }
        http_text(s, "POST", "/v1/attention", "{\"x\": [[1, 2, 3, 4]], \"weights\": \"victim-flip\"}", &r);
        expect_error(&t, &r, 404, "unknown_weight_set", "weights");
        client_response_free(&r);
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-quarantined")) {
        char qdir[PATH_MAX];
        snprintf(qdir, sizeof qdir, "%s/quarantine", dir);
        /* Quarantined once still damaged three intervals (300 ms) after the
         * first sighting: wait up to 5 s. */
        for (double until = client_now_seconds() + 5; client_now_seconds() < until;) {
            size_t moved = 0;
            for (size_t i = 0; i < DAMAGED_COUNT; i++)
                moved += dir_has_prefix(qdir, g_damaged_files[i]) ? 1 : 0;
            if (moved == DAMAGED_COUNT)
                break;
            client_sleep_ms(50);
        }
        for (size_t i = 0; i < DAMAGED_COUNT; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, g_damaged_files[i]);
            expect_true(&t, file_size(path) < 0, "%s is still in the data directory", g_damaged_files[i]);
            expect_true(&t, dir_has_prefix(qdir, g_damaged_files[i]), "%s is not in %s", g_damaged_files[i], qdir);
        }
        test_end(&t);
    }
    if (test_begin(&t, "restart/interrupted-write-removed")) {
        snprintf(path, sizeof path, "%s/%s", dir, st->leftover);
        expect_true(&t, file_size(path) < 0, "the leftover %s is still there", path);
        test_end(&t);
    }
    if (test_begin(&t, "restart/name-starting-with-.tmp-survives")) {
        /* Either the name is refused (400), or a 201 means it is on disk and stays. */
        if (st->dot_tmp_stored) {
            json_t *sent = json_from_text(g_tiny_set), *body = get_set(&t, s, ".tmp.keep", 200);
            if (body != NULL)
                expect_set_body(&t, body, sent);
            else
                test_detail(&t, "    PUT /v1/weight-sets/.tmp.keep answered 201 before the restart");
            json_decref(sent);
            json_decref(body);
        }
        test_end(&t);
    }
    if (test_begin(&t, "restart/damaged-name-reusable")) {
        json_decref(put_set_text(&t, s, "victim-flip", g_tiny_set, 201));
        json_decref(get_set(&t, s, "victim-flip", 200));
        test_end(&t);
    }
}

/*
 * Stores sets, stops the server with SIGTERM, damages some files in its data directory
 * (a flipped byte, a truncated file, a cut header, text, a file whose name does not match
 * the set inside) and leaves an interrupted write (.tmp.*), then starts a server on the
 * same directory: the kept sets must be there bit for bit and usable by name, the damaged
 * ones not served and moved to quarantine/ (by the rescan that finds them still
 * damaged, a few sync intervals later), and the leftover removed.
 */
void run_restart_tests(const struct itest_paths *paths)
{
    (void)paths;
    static const char *const names[] = {
        "server/restart-1", "server/restart-2", "restart/stored-before", "restart/damage-files",
        "restart/sets-identical", "restart/usable-by-name", "restart/damaged-not-served",
        "restart/damaged-quarantined", "restart/interrupted-write-removed",
        "restart/name-starting-with-.tmp-survives", "restart/damaged-name-reusable", NULL};
    if (!any_selected(names))
        return;
    static const struct server_kind kind1 = {"restart-1", g_no_strings, g_no_strings};
    static const char *const fast_sync[] = {"--store-sync-interval", "100", NULL};
    static const struct server_kind kind2 = {"restart-2", fast_sync, g_no_strings};
    struct restart_state st = {0};
    crashed_tmp_name(st.leftover, sizeof st.leftover);
    struct server first, second;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    first.kind = &kind1;
    second.kind = &kind2;
    snprintf(first.data_dir, sizeof first.data_dir, "%s/data-restart", g_tmpdir);
    snprintf(second.data_dir, sizeof second.data_dir, "%s", first.data_dir);
    st.dir = first.data_dir;

    if (server_start(&first) != 0)
        return;
    restart_store_sets(&st, &first);
    server_stop(&first);
    restart_damage_files(&st);
    if (server_start(&second) == 0) {
        restart_check_after(&st, &second);
        server_stop(&second);
    }
    for (size_t i = 0; i < KEEP_COUNT; i++)
        json_decref(st.saved[i]);
    json_decref(st.named_req);
    json_decref(st.named_answer);
    json_decref(st.random_set);
    free(st.random_text);
}
