/*
 * hostile.h - what the hostile suite's files share (hostile.c holds its main and most
 * groups; hostile_json.c the bodies whose JSON costs more memory than their length says).
 */
#ifndef HOSTILE_H
#define HOSTILE_H

#include <sys/types.h>

#include "integration/itest.h"

/* Starts a server on a free loopback port with the group's flags (NULL-terminated; kind
 * must outlive the server); itest_server.c reports "server/GROUP/start" and, at the stop,
 * its exit checks.  Returns 0 when it is up. */
int hostile_server_start(struct server *s, struct server_kind *kind, const char *group,
                         const char *const *flags);

/* The line `key` of /proc/PID/status in KiB (VmHWM: the peak resident set, VmRSS: the
 * resident set now), or -1. */
long hostile_status_kib(pid_t pid, const char *key);

/* The json-memory group (hostile_json.c). */
void hostile_json_memory(void);

#endif
