#!/usr/bin/python3
"""The Triton extensions the tooling reads: statistics and the model repository.

Starts the server on a free loopback port (stopped by its PID), sends v1 and
v2 requests, and checks that GET /v2 lists the extensions, that
/v2/models/stats and /v2/models/{m}[/versions/1]/stats count them in
Triton's shape (v1 and v2 alike, failures apart), that POST
/v2/repository/index lists "attention" and every stored set as READY, and
that load and unload answer a clear error.

Usage: triton_test.py --server PATH [--filter SUBSTR] (only the check
functions whose name contains SUBSTR).  Prints "ok NAME" or "FAIL NAME" per
check and "N passed, N failed" last.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import harness  # noqa: E402
from harness import check  # noqa: E402

TIMINGS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
           "cache_hit", "cache_miss")


def call(srv, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    status, answer, _ = srv.request(method, path, data, {"Content-Type": "application/json"})
    return status, json.loads(answer) if answer else None


def stats_of(srv, path):
    status, answer = call(srv, "GET", path)
    return status, {m["name"]: m for m in (answer or {}).get("model_stats", [])}


def well_formed(m):
    """The members Triton's clients read, with the types they expect."""
    s = m.get("inference_stats", {})
    return isinstance(m.get("version"), str) and all(
        isinstance(m.get(k), int) for k in ("last_inference", "inference_count",
                                            "execution_count")) and \
        all(isinstance(s.get(t, {}).get("count"), int) and isinstance(s[t].get("ns"), int)
            for t in TIMINGS) and isinstance(m.get("batch_stats"), list)


def put_toy(srv):
    """Stores the weight set "toy" (both checks use it; each stores it, so that either
    runs alone)."""
    call(srv, "PUT", "/v1/weight-sets/toy", {"wq": [[1.0, 0.5]], "wk": [[0.5, 1.0]],
                                             "wv": [[1.0, -1.0]]})


def check_statistics(srv):
    status, server = call(srv, "GET", "/v2")
    check("GET /v2 lists statistics and model_repository", status == 200 and
          {"statistics", "model_repository"} <= set(server.get("extensions", [])), server)
    put_toy(srv)
    qkv = {"q": [[0.1, 0.2]], "k": [[0.3, 0.4], [0.5, 0.6]], "v": [[1.0], [2.0]]}
    batched = {"q": [[[0.1, 0.2]]] * 3, "k": [[[0.3, 0.4]]] * 3, "v": [[[1.0]]] * 3}
    ok = [call(srv, "POST", "/v1/attention", qkv)[0], call(srv, "POST", "/v1/attention", batched)[0],
          call(srv, "POST", "/v1/attention", {"x": [[1.0], [2.0]], "weights": "toy"})[0],
          call(srv, "POST", "/v2/models/attention/infer", {"inputs": [
              {"name": n, "shape": [2, 2], "datatype": "FP64", "data": [0.1, 0.2, 0.3, 0.4]}
              for n in "qkv"]})[0],
          call(srv, "POST", "/v2/models/toy/infer", {"inputs": [
              {"name": "x", "shape": [1, 1], "datatype": "FP64", "data": [3.0]}]})[0]]
    bad = [call(srv, "POST", "/v1/attention", {"q": [[1, 2]], "k": [[1]], "v": [[1]]})[0],
           call(srv, "POST", "/v2/models/toy/infer", {"inputs": []})[0]]
    check("requests answered as expected", ok == [200] * 5 and bad == [400, 400], (ok, bad))
    status, models = stats_of(srv, "/v2/models/stats")
    att, toy = models.get("attention", {}), models.get("toy", {})
    check("/v2/models/stats has every model, well formed", status == 200 and
          set(models) == {"attention", "toy"} and all(map(well_formed, models.values())), models)
    a, t = att.get("inference_stats", {}), toy.get("inference_stats", {})
    check("attention: 3 executions (v1 twice, v2 once), 5 inferences, 1 failure",
          att.get("execution_count") == 3 and att.get("inference_count") == 5 and
          a.get("success", {}).get("count") == 3 and a.get("fail", {}).get("count") == 1, att)
    check("toy: v1 by name and v2 counted together, 1 failure",
          toy.get("execution_count") == 2 and t.get("success", {}).get("count") == 2 and
          t.get("fail", {}).get("count") == 1 and toy.get("last_inference", 0) > 0, toy)
    check("phase times add up to the successes' time",
          a["compute_infer"]["ns"] > 0 and a["success"]["ns"] >= a["compute_infer"]["ns"] and
          a["queue"]["count"] == a["compute_input"]["count"] == 3, a)
    status, one = stats_of(srv, "/v2/models/toy/versions/1/stats")
    check("/v2/models/toy/versions/1/stats", status == 200 and list(one) == ["toy"] and
          one["toy"]["execution_count"] == 2, one)
    status, answer = call(srv, "GET", "/v2/models/absent/stats")
    check("stats of an unknown model is 404", status == 404 and "error" in answer, answer)


def check_repository(srv):
    put_toy(srv)
    status, index = call(srv, "POST", "/v2/repository/index", {})
    check("repository index lists attention and toy as READY", status == 200 and
          sorted((m["name"], m["state"], m["version"]) for m in index) ==
          [("attention", "READY", "1"), ("toy", "READY", "1")], index)
    for action in ("load", "unload"):
        status, answer = call(srv, "POST", "/v2/repository/models/toy/" + action, {})
        check("repository " + action + " answers a clear error", status == 400 and
              "PUT /v1/weight-sets/toy" in answer.get("error", ""), answer)


def main():
    args = harness.arguments(__doc__)
    harness.run(args.server, [check_statistics, check_repository])
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
