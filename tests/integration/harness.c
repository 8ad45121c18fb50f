/*
 * harness.c - the bookkeeping every integration program shares (itest, v2test, crashtest,
 * hostile, sharetest): one named test at a time (test_begin, expect_true, test_detail,
 * test_end), the --filter that selects tests by name, the private temporary directory,
 * the closing "N passed, N failed" line, and small file utilities.  The servers under test
 * are itest_server.c's, the HTTP calls and expectations itest_expect.c's; all of them are
 * declared in itest.h.
 */
#include "itest.h"

static int g_passed;
static int g_failed;
/* The --filter SUBSTRs given: a test runs when its name contains every one. */
#define MAX_FILTERS 8
static const char *g_filters[MAX_FILTERS];
static int g_filter_count;
static const char *g_program = "harness";

int test_begin(struct test *t, const char *fmt, ...)
{
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    return harness_selected(t->name);
}

int expect_true(struct test *t, int cond, const char *fmt, ...)
{
    if (cond)
        return 1;
    if (!t->failed) {
        t->failed = 1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t->reason, sizeof t->reason, fmt, ap);
        va_end(ap);
    }
    return 0;
}

void test_detail(struct test *t, const char *fmt, ...)
{
    size_t used = strlen(t->detail);
    if (used + 2 >= sizeof t->detail)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->detail + used, sizeof t->detail - used - 1, fmt, ap);
    va_end(ap);
    used = strlen(t->detail);
    t->detail[used] = '\n';
    t->detail[used + 1] = '\0';
}

void test_end(struct test *t)
{
    /* A program may run a test that --filter leaves out (a step the selected ones build
     * on); it is neither shown nor counted.  The checks of a server's start and exit
     * ("server/...") are reported for every server that was started, whatever the filter. */
    if (!harness_selected(t->name) && strncmp(t->name, "server/", 7) != 0)
        return;
    if (t->failed) {
        printf("FAIL %s: %s\n", t->name, t->reason);
        if (t->detail[0] != '\0')
            printf("%s", t->detail);
        g_failed++;
    } else {
        printf("ok   %s\n", t->name);
        g_passed++;
    }
    fflush(stdout);
}

/* ------------------------------------------------------------------------------------ */
/* Small utilities                                                                       */
/* ------------------------------------------------------------------------------------ */

/* Private directory for bodies, headers and server logs; kept short so paths built
 * from it always fit in PATH_MAX. */
char g_tmpdir[256];

const char *find_case_insensitive(const char *haystack, const char *needle)
{
    size_t n = strlen(needle);
    for (; *haystack != '\0'; haystack++)
        if (strncasecmp(haystack, needle, n) == 0)
            return haystack;
    return n == 0 ? haystack : NULL;
}

void body_snippet(const char *body, size_t len, char *out, size_t cap)
{
    size_t n = 0;
    while (len > 0 && (body[len - 1] == '\n' || body[len - 1] == '\r' || body[len - 1] == ' '))
        len--;
    for (size_t i = 0; i < len && n + 4 < cap && i < 300; i++) {
        unsigned char c = (unsigned char)body[i];
        out[n++] = (c >= 32 && c < 127) ? (char)c : '.';
    }
    if (len > 300 && n + 4 < cap) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}

char **dir_entries(const char *dir, size_t *count)
{
    *count = 0;
    struct dirent **entries = NULL;
    int n = scandir(dir, &entries, NULL, alphasort);
    if (n < 0)
        return NULL;
    char **names = client_xcalloc((size_t)n + 1, sizeof *names);
    for (int i = 0; i < n; i++) {
        if (strcmp(entries[i]->d_name, ".") != 0 && strcmp(entries[i]->d_name, "..") != 0) {
            names[*count] = client_xcalloc(strlen(entries[i]->d_name) + 1, 1);
            strcpy(names[*count], entries[i]->d_name);
            (*count)++;
        }
        free(entries[i]);
    }
    free(entries);
    return names;
}

char **list_json_files(const char *dir, size_t *count)
{
    char **names = dir_entries(dir, count);
    size_t kept = 0;
    for (size_t i = 0; names != NULL && names[i] != NULL; i++) {
        size_t len = strlen(names[i]);
        if (len > 5 && strcmp(names[i] + len - 5, ".json") == 0)
            names[kept++] = names[i];
        else
            free(names[i]);
    }
    if (names != NULL)
        names[kept] = NULL;
    *count = kept;
    return names;
}

void free_name_list(char **names)
{
    if (names == NULL)
        return;
    for (size_t i = 0; names[i] != NULL; i++)
        free(names[i]);
    free(names);
}

char **list_test_files(const char *dir, const char *test_name, const char *what, size_t *count)
{
    struct test t;
    char **files = list_json_files(dir, count);
    if (test_begin(&t, "%s", test_name)) {
        expect_true(&t, files != NULL && *count > 0, "no *.json %s in %s", what, dir);
        test_end(&t);
    }
    return files;
}

int any_selected(const char *const *names)
{
    for (size_t i = 0; names[i] != NULL; i++)
        if (harness_selected(names[i]))
            return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Start and end of a program                                                           */
/* ------------------------------------------------------------------------------------ */

int harness_start(const char *program, const char *filter)
{
    g_program = program;
    if (filter != NULL)
        harness_add_filter(filter);
    client_set_program_name(program);
    signal(SIGPIPE, SIG_IGN);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", program);
    if (client_make_temp_dir(g_tmpdir, sizeof g_tmpdir, NULL, prefix) != 0) {
        fprintf(stderr, "%s: cannot create a temporary directory: %s\n", program, strerror(errno));
        return -1;
    }
    if (g_server_path != NULL && access(g_server_path, X_OK) != 0)
        fprintf(stderr, "%s: warning: %s is not an executable file\n", program, g_server_path);
    return 0;
}

void harness_add_filter(const char *filter)
{
    if (g_filter_count == MAX_FILTERS) {
        fprintf(stderr, "%s: more than %d --filter options\n", g_program, MAX_FILTERS);
        exit(2);
    }
    g_filters[g_filter_count++] = filter;
}

int harness_filtered(void)
{
    return g_filter_count > 0;
}

int harness_selected(const char *name)
{
    for (int i = 0; i < g_filter_count; i++)
        if (strstr(name, g_filters[i]) == NULL)
            return 0;
    return 1;
}

int harness_group_wanted(const char *group)
{
    size_t n = strlen(group);
    for (int i = 0; i < g_filter_count; i++)
        if (strchr(g_filters[i], '/') != NULL &&
            !(strncmp(g_filters[i], group, n) == 0 && g_filters[i][n] == '/'))
            return 0;
    return 1;
}

void test_check(int ok, const char *name, const char *fmt, ...)
{
    struct test t;
    test_begin(&t, "%s", name);
    if (!ok) {
        t.failed = 1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(t.reason, sizeof t.reason, fmt, ap);
        va_end(ap);
    }
    test_end(&t);
}

int harness_failures(void)
{
    return g_failed;
}

int harness_finish(int keep)
{
    printf("%d passed, %d failed\n", g_passed, g_failed);
    fflush(stdout);
    if (g_failed > 0 || keep)
        fprintf(stderr, "%s: kept server logs in %s\n", g_program, g_tmpdir);
    else
        client_remove_tree(g_tmpdir); /* it holds only files this program created */
    return g_failed > 0 ? 1 : 0;
}
