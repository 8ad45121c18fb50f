#!/usr/bin/python3
"""Cache policies on sequences (docs/contract.md, "Cache policies"), from outside: each policy
replayed against a NumPy simulation written here from the contract's rules, and every bad
parameter.

- replay_*: window (StreamingLLM), h2o and snapkv, each over 2,000 steps of one token after
  a prompt, with compare_full: FP32 with 4 heads after a prompt of 300 tokens, and FP64 with
  no heads axis after a prompt of 1 token.  At every step: kept_positions identical, length,
  output, attention (over the keys the queries saw), received_total of the kept keys,
  lost_mass and output_error against the simulation's full cache.  Over v2 binary tensors.
- wires_*: each policy over v1, v2 JSON, gRPC ModelInfer and a ModelStreamInfer stream for a
  shorter replay (prompt 40, 60 steps, some of 3 tokens), the outputs and their datatypes.
- defaults: cache_sink 4, cache_recent budget / 2, SnapKV's window min(32, budget) and pool
  7 when not given; full with compare_full answers zeros.
- errors_*: every bad parameter (unknown policy, wrong types, zero and negative sizes, a
  policy's parameter on another policy or without sequence_start or without a sequence, a
  missing size, a budget below the recent or window size, an even pool, more queries than
  the step's keys, a policy's output on a sequence without one) over v1, v2 and gRPC: 400
  with the field, and no sequence left behind.
- weight_set: h2o with compare_full on a stored set with 2 heads, biases and wo/bo, FP64 and
  FP32 x over v2 binary and gRPC: the output through wo and bo, the damage per head.
- ties: keys of zeros with causal false tie every score exactly: h2o and snapkv keep the
  earlier positions (the simulation is given no say of the server's here).
- memory: attn_sequence_cached_bytes counts both caches (kept keys with their totals and
  positions, and the full cache); attn_sequence_evicted_keys_total counts the evictions;
  sequence_end returns it all.

Ties: the rules break them towards the earlier position, exactly.  Where the simulation's
float64 scores put two keys within the tolerance of each other at the budget's edge, the
server's float32 (or float64) sums may order them either way: there the simulation takes the
server's choice if it keeps every key the simulation keeps beyond the tolerance and none it
evicts beyond it, so that one near-tie is not the start of a run of false failures.

Tolerances: float32 within 1e-5 relative (floors 1e-6 absolute; 1e-5 for output_error, a
ratio of two float32 differences); float64 within 1e-12 relative (floor 1e-13).

Usage: policy_test.py --server PATH [--filter SUBSTR]; POLICY_STEPS sets the replays' length
(2,000; the ASan build's suite replays 300, every policy still past its budget many times).  Prints "ok NAME" or "FAIL NAME" per
check and "N passed, N failed" last.
"""
import os
import sys

import numpy as np  # noqa: E402  (Debian's python3-numpy)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sequence_test as st  # noqa: E402
from sequence_test import harness, check, named, fresh_id, f32, send, expect_error  # noqa: E402

import grpc  # noqa: E402

TOLS = {"float64": (1e-12, 1e-13, 1e-12), "float32": (1e-5, 1e-6, 1e-5)}
TIE = {"float64": (1e-11, 1e-14), "float32": (2e-5, 1e-7)}    # near-tie band: rel, abs
POLICIES = {
    "window": {"cache_policy": "window", "cache_sink": 4, "cache_window": 28},
    "h2o": {"cache_policy": "h2o", "cache_budget": 32, "cache_recent": 8},
    "snapkv": {"cache_policy": "snapkv", "cache_budget": 32, "cache_window": 8,
               "cache_pool": 5},
}
DK = 8                      # per head
LISTED = ["output", "attention", "received_total", "length", "kept_positions", "lost_mass",
          "output_error"]
STEPS = int(os.environ.get("POLICY_STEPS", "2000"))    # policies-asan: fewer (tests/run.sh)


class PolicySim:
    """A sequence under a cache policy, in float64, by the contract's rules.  heads None: no
    heads axis in the answers."""

    def __init__(self, policy, heads, dk, dv, dtype, causal=True):
        self.p = dict(policy)
        self.causal = causal
        self.heads, self.H, self.dtype = heads, heads or 1, dtype
        self.dkh, self.dvh = dk // self.H, dv // self.H
        self.scale = 1.0 / np.sqrt(self.dkh)
        self.K = np.zeros((0, dk))
        self.V = np.zeros((0, dv))
        self.kept = [np.zeros(0, np.int64) for _ in range(self.H)]
        self.total = [np.zeros(0) for _ in range(self.H)]       # by position
        self.boundary = 0
        self.compare = bool(self.p.get("compare_full"))
        self.ties = 0

    def _attend(self, q, keys, values, qpos, kpos):
        s = q @ keys.T * self.scale
        if self.causal:
            s = np.where(kpos[None, :] <= qpos[:, None], s, -np.inf)
        e = np.exp(s - s.max(1, keepdims=True))
        w = e / e.sum(1, keepdims=True)
        return w, w @ values

    def _near(self, a, b):
        rel, floor = TIE[self.dtype]
        return abs(a - b) <= rel * max(abs(a), abs(b)) + floor

    def _top(self, cand, scores, want, server):
        """Of positions cand, the `want` with the highest scores (ties: the earlier stays);
        at a near-tie on the edge, the server's choice where the band allows it."""
        if want >= len(cand):
            return cand
        order = np.lexsort((cand, -scores))
        mine = np.sort(cand[order[:want]])
        lo, hi = scores[order[want - 1]] if want > 0 else np.inf, scores[order[want]]
        if want == 0 or not self._near(lo, hi) or server is None:
            return mine
        theirs = np.intersect1d(server, cand)
        sure_in = cand[scores > lo + abs(lo - hi) + TIE[self.dtype][0] * abs(lo) * 4]
        if len(theirs) == want and np.all(np.isin(sure_in, theirs)):
            rel, floor = TIE[self.dtype]
            s_of = dict(zip(cand.tolist(), scores.tolist()))
            if all(s_of[p] >= hi - (rel * abs(hi) + floor) for p in theirs):
                if not np.array_equal(theirs, mine):
                    self.ties += 1
                return theirs
        return mine

    def step(self, q, k, v, server_kept=None):
        """Appends k, v; returns {name: expected} of the step's answer.  server_kept: the
        answer's kept_positions ([H, n]), for near-ties."""
        m, t, p = len(q), len(k), self.p
        p0 = len(self.K)
        self.K, self.V = np.vstack([self.K, k]), np.vstack([self.V, v])
        N = p0 + t
        qpos = N - m + np.arange(m)
        out = np.zeros((m, self.H * self.dvh))
        att, lost, err, seen_all = [], np.zeros((self.H, m)), np.zeros((self.H, m)), []
        for h in range(self.H):
            ks, vs = slice(h * self.dkh, (h + 1) * self.dkh), slice(h * self.dvh,
                                                                     (h + 1) * self.dvh)
            seen = np.concatenate([self.kept[h], np.arange(p0, N)])
            seen_all.append(seen)
            w, o = self._attend(q[:, ks], self.K[seen, ks], self.V[seen, vs], qpos, seen)
            out[:, vs] = o
            att.append(w)
            tot = np.zeros(N)
            tot[:len(self.total[h])] = self.total[h]
            tot[seen] += w.sum(0)
            self.total[h] = tot
            if self.compare:
                allp = np.arange(N)
                wf, of = self._attend(q[:, ks], self.K[:, ks], self.V[:, vs], qpos, allp)
                gone = ~np.isin(allp, seen)
                lost[h] = wf[:, gone].sum(1)
                nf = np.linalg.norm(of, axis=1)
                d = np.linalg.norm(o - of, axis=1)
                err[h] = np.where(nf > 0, d / np.where(nf > 0, nf, 1), d)
            if p["cache_policy"] == "snapkv" and p0 == 0:
                wobs = w[-min(p["cache_window"], m):].sum(0)       # over all seen = all keys
                self._obs = getattr(self, "_obs", {})
                self._obs[h] = wobs
        prompt = p0 == 0
        if prompt and p["cache_policy"] == "snapkv":
            self.boundary = max(0, N - p["cache_window"])
        for h in range(self.H):
            seen = seen_all[h]
            srv = None if server_kept is None else np.asarray(server_kept[h], np.int64)
            pol = p["cache_policy"]
            if pol == "window":
                keep = seen[(seen < p["cache_sink"]) | (seen >= N - p["cache_window"])]
            elif pol == "h2o":
                if len(seen) <= p["cache_budget"]:
                    keep = seen
                else:
                    r = min(p["cache_recent"], len(seen))
                    cand = seen[:len(seen) - r]
                    top = self._top(cand, self.total[h][cand],
                                    p["cache_budget"] - p["cache_recent"], srv)
                    keep = np.concatenate([top, seen[len(seen) - r:]])
            elif prompt:    # snapkv's prompt
                c = int(np.sum(seen < self.boundary))
                s = self._obs[h][:c]
                half = p["cache_pool"] // 2
                pooled = np.array([s[max(0, j - half):j + half + 1].max() for j in range(c)])
                top = self._top(seen[:c], pooled, p["cache_budget"] - p["cache_window"], srv)
                keep = np.concatenate([top, seen[c:]])
            else:
                keep = seen[(seen < self.boundary) | (seen >= N - p["cache_window"])]
            self.kept[h] = np.sort(keep)
        n = len(self.kept[0])
        want = {"output": out, "attention": np.stack(att),
                "received_total": np.stack([self.total[h][self.kept[h]] for h in range(self.H)]),
                "kept_positions": np.stack(self.kept), "length": np.array([n])}
        if self.compare:
            want["lost_mass"], want["output_error"] = lost, err
        if self.heads is None:
            for name in ("attention", "received_total", "kept_positions", "lost_mass",
                         "output_error"):
                if name in want:
                    want[name] = want[name][0]
        return want


def differences(outs, want, dtype):
    """The outputs of want that outs lacks or gets wrong, as short sentences."""
    rel, floor, err_floor = TOLS[dtype]
    bad = []
    for name, val in want.items():
        if name not in outs:
            bad.append(name + " missing")
            continue
        got = np.asarray(outs[name])
        if got.shape != val.shape:
            bad.append("%s shape %s, want %s" % (name, list(got.shape), list(val.shape)))
        elif name in ("kept_positions", "length"):
            if not np.array_equal(got.astype(np.int64), val):
                at = np.flatnonzero(got.astype(np.int64).ravel() != val.ravel())[:4]
                bad.append("%s differs at %s: %s, want %s" % (
                    name, at.tolist(), got.ravel()[at].tolist(), val.ravel()[at].tolist()))
        else:
            f = err_floor if name == "output_error" else floor
            e = np.abs(got.astype(np.float64) - val) - (rel * np.abs(val) + f)
            if not bool(np.all(e <= 0)):
                i = int(np.argmax(e))
                bad.append("%s off by %.3g at %d (%r, want %r)" % (
                    name, float(np.abs(got.astype(np.float64) - val).ravel()[i]), i,
                    float(got.ravel()[i]), float(val.ravel()[i])))
    return bad


def request(q, k, v, dtype, heads, sid, start=False, end=False, policy=None, total=True):
    """A step; policy: the cache policy's parameters, sent where the wire puts them
    (send_step)."""
    return {"q": q, "k": k, "v": v, "dtype": dtype, "heads": heads, "sid": sid,
            "start": start, "end": end, "total": total, "policy": policy, "outputs": None}


def send_step(wire, srv, req, stream=None):
    """sequence_test's send, with the policy's parameters in v1's "sequence" object or among
    v2's parameters."""
    req = dict(req, **{"seq_extra" if wire == "v1" else "extra": req.get("policy")})
    return send(wire, srv, req, stream)


def tokens(rng, n, dk, dv, dtype):
    """q, k, v of n tokens; float32 ones rounded, as the server will hold them."""
    r = (lambda a: f32(a)) if dtype == "float32" else (lambda a: a)
    return (r(rng.standard_normal((n, dk))), r(rng.standard_normal((n, dk)) * 1.5),
            r(rng.standard_normal((n, dk))))


def replay(srv, wire, name, policy, dtype, heads, prompt, steps, rng, sizes=(1,),
           stream=None, report_every=None):
    """One sequence: a prompt then steps of the sizes given in turn, each answer against the
    simulation.  Returns (checks passed, failed, near-ties taken)."""
    H = heads or 1
    dk = dv = DK * H
    policy = dict(policy, compare_full=True)
    sim = PolicySim(policy, heads, dk, dv, dtype)
    sid = fresh_id()
    good = bad = 0
    first_bad = None
    for i in range(steps + 1):
        t = prompt if i == 0 else sizes[i % len(sizes)]
        q, k, v = tokens(rng, t, dk, dv, dtype)
        req = request(q, k, v, dtype, heads, sid, start=i == 0, end=i == steps,
                      policy=policy if i == 0 else None)
        # v2: the policy's outputs listed by name on some wires, by default on the others
        req["outputs"] = LISTED if wire in ("v2json", "stream") else None if wire == "v1" else []
        ans = send_step(wire, srv, req, stream)
        if not ans.ok:
            check("%s step %d answered" % (name, i), False, ans)
            return
        kept = ans.outs.get("kept_positions")
        want = sim.step(q, k, v, None if kept is None else
                        (kept if heads else np.asarray(kept)[None]))
        diffs = differences(ans.outs, want, dtype)
        if ans.types:
            for n_, ty in ans.types.items():
                if ty != ("INT64" if n_ in ("kept_positions", "length") else st.DATATYPE[dtype]):
                    diffs.append("%s datatype %s" % (n_, ty))
        if diffs:
            bad += 1
            first_bad = first_bad or "step %d: %s" % (i, "; ".join(diffs))
        else:
            good += 1
    check("%s: %d steps as the simulation (%d near-ties at the budget's edge took the "
          "server's choice)" % (name, steps + 1, sim.ties), bad == 0,
          "%d of %d steps differ; first %s" % (bad, steps + 1, first_bad))


def check_replays(srv):
    rng = np.random.default_rng(52)
    for pol, params in POLICIES.items():
        replay(srv, "v2bin", "replay_%s_fp32_heads4_prompt300" % pol, params, "float32", 4,
               300, STEPS, rng)
        replay(srv, "v2bin", "replay_%s_fp64_noheads_prompt1" % pol, params, "float64", None,
               1, STEPS, rng)


def check_wires(srv):
    rng = np.random.default_rng(53)
    for wire in ("v1", "v2json", "grpc", "stream"):
        for pol, params in POLICIES.items():
            stream = st.Stream(srv) if wire == "stream" else None
            try:
                replay(srv, wire, "wires_%s_%s" % (wire, pol), params,
                       "float32" if wire in ("grpc", "v2json") else "float64", 2, 40, 60, rng,
                       sizes=(1, 1, 3), stream=stream)
            finally:
                if stream:
                    stream.close()


def check_defaults(srv):
    rng = np.random.default_rng(54)
    given = {"window": ({"cache_policy": "window", "cache_window": 10},
                        {"cache_sink": 4}),
             "h2o": ({"cache_policy": "h2o", "cache_budget": 20}, {"cache_recent": 10}),
             "snapkv": ({"cache_policy": "snapkv", "cache_budget": 48},
                        {"cache_window": 32, "cache_pool": 7}),
             "snapkv_small": ({"cache_policy": "snapkv", "cache_budget": 12},
                              {"cache_window": 12, "cache_pool": 7})}
    for name, (asked, defaults) in given.items():
        # the simulation runs on the defaults the contract states; the server is given none
        sim = PolicySim(dict(asked, **defaults, compare_full=True), 2, 2 * DK, 2 * DK,
                        "float64")
        sid, bad = fresh_id(), []
        for i in range(41):
            q, k, v = tokens(rng, 70 if i == 0 else 1, 2 * DK, 2 * DK, "float64")
            req = request(q, k, v, "float64", 2, sid, i == 0, i == 40,
                          dict(asked, compare_full=True) if i == 0 else None)
            req["outputs"] = []
            ans = send_step("v2json", srv, req)
            if not ans.ok:
                bad.append("step %d: %r" % (i, ans))
                break
            bad += ["step %d: %s" % (i, d) for d in
                    differences(ans.outs, sim.step(q, k, v, ans.outs["kept_positions"]),
                                "float64")]
        check("defaults_%s (%s)" % (name, defaults), not bad, "; ".join(bad[:3]))
    # full with compare_full: nothing evicted, nothing lost; no kept_positions
    sid = fresh_id()
    q, k, v = tokens(rng, 5, 2 * DK, 2 * DK, "float64")
    req = request(q, k, v, "float64", 2, sid, True, True,
                  {"cache_policy": "full", "compare_full": True})
    req["outputs"] = []
    ans = send_step("v2json", srv, req)
    check("defaults_full_compare_zeros", ans.ok and "kept_positions" not in ans.outs and
          np.all(ans.outs.get("lost_mass", [1]) == 0) and
          np.all(ans.outs.get("output_error", [1]) == 0) and
          np.asarray(ans.outs.get("lost_mass")).shape == (2, 5), ans)


def check_ties(srv):
    """Exact ties: keys of zeros and causal false give every key the same score, so every
    weight is 1/n in any precision and the totals tie exactly: the earlier positions stay."""
    rng = np.random.default_rng(57)
    for pol in ("h2o", "snapkv"):
        params = dict(POLICIES[pol], compare_full=True)
        sim = PolicySim(params, 2, 2 * DK, 2 * DK, "float32", causal=False)
        sid, bad = fresh_id(), []
        for i in range(31):
            t = 50 if i == 0 else 1
            q, _, v = tokens(rng, t, 2 * DK, 2 * DK, "float32")
            k = np.zeros((t, 2 * DK))
            req = request(q, k, v, "float32", 2, sid, i == 0, i == 30,
                          params if i == 0 else None)
            req["causal"], req["outputs"] = False, []
            ans = send_step("v2bin", srv, req)
            if not ans.ok:
                bad.append("step %d: %r" % (i, ans))
                break
            bad += ["step %d: %s" % (i, d) for d in
                    differences(ans.outs, sim.step(q, k, v), "float32")]
        check("ties_%s: equal scores keep the earlier positions" % pol, not bad,
              "; ".join(bad[:3]))


def check_weight_set(srv):
    """A policy on a stored set with 2 heads, every bias and wo/bo (a decoder layer's
    attention with its cache), FP64 and FP32 x over v2 binary and gRPC: the simulation runs
    on the projected q, k and v; the answer's output is its output through wo and bo, while
    lost_mass and output_error are each head's, before wo."""
    status, text, _ = srv.request("PUT", "/v1/weight-sets/polwo",
                                  st.json.dumps(st.WEIGHTS_WO).encode(),
                                  {"Content-Type": "application/json"})
    check("weight set/stored", status in (200, 201), (status, text[:200]))
    w = {n: np.array(v) for n, v in st.WEIGHTS_WO.items() if n != "heads"}
    rng = np.random.default_rng(58)
    params = {"cache_policy": "h2o", "cache_budget": 8, "cache_recent": 2, "compare_full": True}
    for dtype in ("float64", "float32"):
        for wire in ("v2bin", "grpc"):
            sim = PolicySim(params, 2, 4, 6, dtype)
            sid, bad = fresh_id(), []
            for i in range(31):
                m = 12 if i == 0 else 1
                x = rng.standard_normal((m, 5))
                typed = x.astype(np.float64 if dtype == "float64" else np.float32)
                xr = typed.astype(np.float64)
                want = sim.step(xr @ w["wq"] + w["bq"], xr @ w["wk"] + w["bk"],
                                xr @ w["wv"] + w["bv"])
                want["output"] = want["output"] @ w["wo"] + w["bo"]
                params_i = dict(params) if i == 0 else {}
                params_i.update({"sequence_id": sid, "sequence_start": i == 0,
                                 "sequence_end": i == 30, "received_total": True})
                req = {"tensors": [("x", st.DATATYPE[dtype], [m, 5], typed.tobytes(),
                                    typed.ravel().tolist())], "outputs": LISTED,
                       "extra": params_i}
                ans = st.send_v2_http(srv, req, True, "polwo") if wire == "v2bin" else \
                    st.send_grpc(srv, req, "polwo")
                if not ans.ok:
                    bad.append("step %d: %r" % (i, ans))
                    break
                bad += ["step %d: %s" % (i, d) for d in differences(ans.outs, want, dtype)]
            check("weight_set_%s_%s: h2o on a stored set with wo, 31 steps" % (wire, dtype),
                  not bad, "; ".join(bad[:3]))


def live(srv):
    return st.metrics(srv).get("attn_sequences_live")


def check_errors(srv, wire):
    rng = np.random.default_rng(55)
    pre = "sequence." if wire == "v1" else "parameters."
    start = {"cache_policy": "h2o", "cache_budget": 8}
    cases = [
        ("unknown_policy", {"cache_policy": "lru"}, "invalid_value", "cache_policy"),
        ("policy_not_string", {"cache_policy": 3}, "wrong_type", "cache_policy"),
        ("budget_string", {"cache_policy": "h2o", "cache_budget": "8"}, "wrong_type",
         "cache_budget"),
        ("budget_zero", {"cache_policy": "h2o", "cache_budget": 0}, "invalid_value",
         "cache_budget"),
        ("window_negative", {"cache_policy": "window", "cache_window": -3}, "invalid_value",
         "cache_window"),
        ("sink_negative", {"cache_policy": "window", "cache_window": 4, "cache_sink": -1},
         "invalid_value", "cache_sink"),
        ("budget_fraction", {"cache_policy": "h2o", "cache_budget": 2.5}, "invalid_value",
         "cache_budget"),
        ("pool_zero", {"cache_policy": "snapkv", "cache_budget": 8, "cache_pool": 0},
         "invalid_value", "cache_pool"),
        ("pool_even", {"cache_policy": "snapkv", "cache_budget": 8, "cache_pool": 4},
         "invalid_value", "cache_pool"),
        ("budget_below_recent", {"cache_policy": "h2o", "cache_budget": 4, "cache_recent": 5},
         "invalid_value", "cache_budget"),
        ("budget_below_window", {"cache_policy": "snapkv", "cache_budget": 4,
                                 "cache_window": 6}, "invalid_value", "cache_budget"),
        ("window_missing", {"cache_policy": "window"}, "missing_field", "cache_window"),
        ("budget_missing_h2o", {"cache_policy": "h2o", "cache_recent": 2}, "missing_field",
         "cache_budget"),
        ("budget_missing_snapkv", {"cache_policy": "snapkv"}, "missing_field", "cache_budget"),
        ("budget_on_window", {"cache_policy": "window", "cache_window": 4, "cache_budget": 8},
         "conflicting_fields", "cache_budget"),
        ("sink_on_h2o", {"cache_policy": "h2o", "cache_budget": 8, "cache_sink": 2},
         "conflicting_fields", "cache_sink"),
        ("recent_on_snapkv", {"cache_policy": "snapkv", "cache_budget": 8, "cache_recent": 2},
         "conflicting_fields", "cache_recent"),
        ("pool_on_h2o", {"cache_policy": "h2o", "cache_budget": 8, "cache_pool": 3},
         "conflicting_fields", "cache_pool"),
        ("budget_on_default_full", {"cache_budget": 8}, "conflicting_fields", "cache_budget"),
        ("compare_not_bool", {"cache_policy": "h2o", "cache_budget": 8, "compare_full": 1},
         "wrong_type", "compare_full"),
    ]
    for tag, params, code, field in cases:
        before = live(srv)
        sid = fresh_id()
        q, k, v = tokens(rng, 3, DK, DK, "float64")
        ans = send_step(wire, srv, request(q, k, v, "float64", None, sid, True, False, params))
        expect_error("errors_%s_%s" % (wire, tag), wire, ans, 400, code, pre + field,
                     grpc.StatusCode.INVALID_ARGUMENT)
        again = send_step(wire, srv, request(q, k, v, "float64", None, sid, False, True))
        check("errors_%s_%s leaves no sequence" % (wire, tag),
              not again.ok and "holds no sequence" in again.words and live(srv) == before,
              "%r; live %s -> %s" % (again, before, live(srv)))
    # a policy's parameter without sequence_start, or without a sequence at all
    sid = fresh_id()
    q, k, v = tokens(rng, 3, DK, DK, "float64")
    ok = send_step(wire, srv, request(q, k, v, "float64", None, sid, True, False, start))
    check("errors_%s start for the next" % wire, ok.ok, ok)
    ans = send_step(wire, srv, request(q, k, v, "float64", None, sid, False, False,
                                  {"cache_budget": 8}))
    expect_error("errors_%s_policy_without_start" % wire, wire, ans, 400,
                 "conflicting_fields", pre + "cache_budget", grpc.StatusCode.INVALID_ARGUMENT)
    ans = send_step(wire, srv, request(q, k, v, "float64", None, None, policy=start,
                                       total=False))
    expect_error("errors_%s_policy_without_sequence" % wire, wire, ans, 400,
                 "conflicting_fields", pre + "cache_policy", grpc.StatusCode.INVALID_ARGUMENT)
    # more queries than the step's keys under a policy
    q3, k1, v1 = tokens(rng, 3, DK, DK, "float64")
    ans = send_step(wire, srv, request(q3, k1[:1], v1[:1], "float64", None, sid))
    expect_error("errors_%s_queries_past_the_steps_keys" % wire, wire, ans, 400,
                 "invalid_shape", "q" if wire == "v1" else "inputs[0]",
                 grpc.StatusCode.INVALID_ARGUMENT)
    # the sequence goes on as if neither came: 3 keys cached, then 3 more
    ans = send_step(wire, srv, request(q, k, v, "float64", None, sid, False, True))
    check("errors_%s sequence unharmed" % wire, ans.ok and
          int(np.asarray(ans.outs.get("length", [0]))[0]) == 6, ans)
    if wire in ("v2json", "grpc"):
        # a policy's output named on a sequence without a policy
        sid = fresh_id()
        req = request(q, k, v, "float64", None, sid, True, True)
        req["outputs"] = ["output", "kept_positions"]
        req["total"] = False
        ans = send_step(wire, srv, req)
        expect_error("errors_%s_kept_positions_without_policy" % wire, wire, ans, 400,
                     "conflicting_fields", "parameters.sequence_id",
                     grpc.StatusCode.INVALID_ARGUMENT, ("kept_positions",))


def check_memory(srv):
    rng = np.random.default_rng(56)
    m0 = st.metrics(srv)
    bytes0 = m0.get("attn_sequence_cached_bytes", 0)
    ev0 = m0.get("attn_sequence_evicted_keys_total", 0)
    sid, H, dk = fresh_id(), 2, 2 * DK
    params = {"cache_policy": "window", "cache_sink": 2, "cache_window": 6,
              "compare_full": True}
    for i in range(31):
        q, k, v = tokens(rng, 10 if i == 0 else 1, dk, dk, "float32")
        ans = send_step("v2bin", srv, request(q, k, v, "float32", H, sid, i == 0, False,
                                         params if i == 0 else None, total=False))
        if not ans.ok:
            check("memory step %d" % i, False, ans)
            return
    m = st.metrics(srv)
    appended, kept = 40, 8
    per_key = 2 * dk * 4 + H * 8 + H * 8          # key, value, totals, positions
    full_key = 2 * dk * 4
    want = kept * per_key + appended * full_key
    check("memory: cached bytes count both caches (%d kept, %d in the full cache)" %
          (kept, appended), m.get("attn_sequence_cached_bytes", 0) - bytes0 == want,
          "%s, want %d more" % (m.get("attn_sequence_cached_bytes"), want))
    check("memory: evictions counted", m.get("attn_sequence_evicted_keys_total", 0) - ev0 ==
          appended - kept, m.get("attn_sequence_evicted_keys_total"))
    q, k, v = tokens(rng, 1, dk, dk, "float32")
    ans = send_step("v2bin", srv, request(q, k, v, "float32", H, sid, False, True, total=False))
    m = st.metrics(srv)
    check("memory: sequence_end returns both caches", ans.ok and
          m.get("attn_sequence_cached_bytes", -1) == bytes0, m.get("attn_sequence_cached_bytes"))


def main():
    args = harness.arguments(__doc__)
    checks = [named("check_replays", check_replays), named("check_wires", check_wires),
              named("check_defaults", check_defaults), named("check_ties", check_ties),
              named("check_weight_set", check_weight_set),
              named("check_memory", check_memory)]
    checks += [named("check_errors_" + w, lambda srv, w=w: check_errors(srv, w))
               for w in ("v1", "v2json", "grpc")]
    harness.run(args.server, [st.guarded(c) for c in checks], server_class=st.GrpcServer)
    return harness.summary()


if __name__ == "__main__":
    sys.exit(main())
