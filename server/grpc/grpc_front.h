/*
 * grpc_front.h - the Open Inference Protocol over gRPC, beside HTTP.
 *
 * Serves Triton's inference.GRPCInferenceService (the RPCs api/grpc/
 * inference.proto declares) and grpc.health.v1.Health on --grpc-port of
 * --host, with gRPC's C core and protobuf-c.  Every RPC is answered by the
 * router (router/api.h) as its HTTP v2 twin is: the same handlers, rules,
 * words, admission and statistics, the neutral request and answer of
 * message/ in place of JSON; the same limits on connections, messages and
 * memory (core/conn_ledger.h, the client's share of the budget); and the
 * same queue for the --max-inflight workers (work/work_queue.h).  This module
 * translates the messages, holds the limits gRPC's core does not, and maps
 * the HTTP status to a gRPC status code.  A computation runs under a compute
 * token that carries the call's deadline and is stopped when the call is
 * cancelled.
 */
#ifndef ATTN_GRPC_FRONT_H
#define ATTN_GRPC_FRONT_H

#include "core/config.h"
#include "core/error.h"

typedef struct grpc_front grpc_front;

/* Starts serving on cfg->host:cfg->grpc_port, -1 for a free port (cfg
 * borrowed for the life of the server; the router must be initialised; 0
 * means off and is the caller's to honour).  Returns the server, or NULL
 * with err filled and nothing left running. */
grpc_front *grpc_front_start(const server_config *cfg, attn_error *err);

/* The port it listens on: cfg->grpc_port, or the one chosen for -1. */
int grpc_front_port(const grpc_front *front);

/* Stops: calls still waiting for a worker are answered UNAVAILABLE, those
 * computing end (main.c stops their computations while it drains), the rest
 * are cancelled; then everything is freed.  NULL is allowed. */
void grpc_front_stop(grpc_front *front);

#endif
