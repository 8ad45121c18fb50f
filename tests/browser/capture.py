#!/usr/bin/python3
"""The capture lines of docs/visualizer.md, run as they are on a small random model.

docs/visualizer.md gives the Python that writes a capture (q and k of every layer of a
PyTorch model, from forward hooks on its projections, as a safetensors file) for the
visualizer's heads census.  This script takes that block out of the document (the ```python
block after the comment "viz-capture-test"), builds a small random transformer laid out as the
block expects (model.model.layers[L].self_attn.q_proj / k_proj, LLaMA's names), runs the block
in a temp directory and checks the file it wrote:

  * the safetensors rules the server applies (server/checkpoint/safetensors.c): an 8-byte
    little-endian header length, a JSON object without duplicate keys, __metadata__ of
    strings, each tensor's dtype, shape and data_offsets agreeing with its bytes, inside the
    data and overlapping no other;
  * what the page reads (server/viz/page/viz_capture.js): layer.L.q and layer.L.k for
    L = 0 .. layers-1, [heads, tokens, head_dim] in F16, and __metadata__ "tokens" a JSON
    array of the tokens;
  * the numbers: each layer's q and k are the model's own projections of that layer's input,
    computed here again by a forward pass of this script's own, rounded to FP16.

Two uses:
  capture.py [--filter SUBSTR]           the checks above, "ok NAME"/"FAIL NAME: why" and
                                         "N passed, N failed" (a suite of `make test`)
  capture.py --write DIR [--layers N --heads H --tokens T --dim D --kv-heads K --seed S
             --sink S --local W --no-causal --no-reference
             --cache-policy P [--cache-budget B ... --prompt N]]
                                         writes DIR/capture.safetensors by the document's
                                         lines and DIR/reference.json: per layer and head the
                                         census statistics computed here in float64 NumPy from
                                         the file's FP16 q and k (the browser test's reference);
                                         with --cache-policy also each head replayed through
                                         that cache policy (replay_reference), its kept
                                         positions, lost_mass and output_error at every step
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
from torch import nn

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "visualizer.md")
MARKER = "<!-- viz-capture-test:"


def capture_block(doc_path=DOC):
    """The text of the ```python block right after the marker comment."""
    text = open(doc_path, encoding="utf-8").read()
    at = text.find(MARKER)
    if at < 0:
        raise RuntimeError("docs/visualizer.md has no %s ... --> comment" % MARKER)
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, at)
    if m is None or text[at:m.start()].count("\n") > 1:
        raise RuntimeError("no ```python block right after the viz-capture-test comment")
    return m.group(1)


# ---------------------------------------------------------------- the small random model

class Attention(nn.Module):
    """Causal multi-head attention with grouped key heads, as LLaMA's (without rotary)."""

    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim)
        self.o_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(rep, 1)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2).repeat_interleave(rep, 1)
        out = torch.empty_like(q)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        for h in range(self.heads):   # one head at a time: a long sequence's matrix per head only
            s = q[:, h] @ k[:, h].transpose(-1, -2) / math.sqrt(self.head_dim)
            out[:, h] = s.masked_fill(causal, float("-inf")).softmax(-1) @ v[:, h]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self, dim, heads, kv_heads):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, heads, kv_heads)

    def forward(self, x):
        return x + self.self_attn(self.norm(x))


class Inner(nn.Module):
    def __init__(self, vocab, dim, heads, kv_heads, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, kv_heads) for _ in range(layers))

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return x


class Model(nn.Module):
    """A decoder laid out as transformers' LlamaForCausalLM: model.model.layers[L].self_attn."""

    def __init__(self, vocab=50, dim=32, heads=4, kv_heads=4, layers=3):
        super().__init__()
        self.model = Inner(vocab, dim, heads, kv_heads, layers)

    def forward(self, ids):
        return self.model(ids)


def build(layers, heads, kv_heads, dim, tokens, seed):
    """(model, input_ids, token strings) of a random model; the projections' scale is raised
    so that heads differ (some peaked, some flat), as trained heads do."""
    torch.manual_seed(seed)
    model = Model(vocab=97, dim=dim, heads=heads, kv_heads=kv_heads, layers=layers).eval()
    with torch.no_grad():
        for L, layer in enumerate(model.model.layers):
            for h in range(heads):
                rows = slice(h * (dim // heads), (h + 1) * (dim // heads))
                layer.self_attn.q_proj.weight[rows] *= 1 + 2 * ((L * heads + h) % 5)
    ids = torch.randint(0, 97, (1, tokens))
    words = ["tok%d" % int(i) for i in ids[0]]
    return model, ids, words


def run_block(workdir, model, ids, words, heads):
    """Runs the document's block in workdir with the names it expects; returns the file."""
    names = {"model": model, "input_ids": ids, "tokens": words, "heads": heads}
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        exec(compile(capture_block(), "docs/visualizer.md (viz-capture-test)", "exec"), names)
    finally:
        os.chdir(cwd)
    return os.path.join(workdir, "capture.safetensors")


# ---------------------------------------------------------------- reading the file

def read_safetensors(path):
    """(metadata, {name: np.ndarray}) of a safetensors file, checked by the server's rules;
    raises ValueError saying what breaks them."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise ValueError("fewer than 8 bytes")
    n = struct.unpack("<Q", raw[:8])[0]
    if n > len(raw) - 8:
        raise ValueError("header length %d past the end" % n)

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("a key twice in one object of the header")
        return dict(pairs)

    header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=no_duplicates)
    if not isinstance(header, dict):
        raise ValueError("the header is not an object")
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ is not an object of strings")
    sizes = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2)}
    tensors, spans = {}, []
    for name, e in header.items():
        if e.get("dtype") not in sizes:
            raise ValueError("%s: dtype %r" % (name, e.get("dtype")))
        shape, (begin, end) = e["shape"], e["data_offsets"]
        if not (0 <= begin <= end <= len(data)):
            raise ValueError("%s: data_offsets %r outside the %d bytes of data" % (name, e["data_offsets"], len(data)))
        dt, size = sizes[e["dtype"]]
        if int(np.prod(shape)) * size != end - begin:
            raise ValueError("%s: shape %r and dtype make %d bytes, the offsets span %d"
                             % (name, shape, int(np.prod(shape)) * size, end - begin))
        tensors[name] = np.frombuffer(data[begin:end], dtype=dt).reshape(shape)
        spans.append((begin, end, name))
    reach = 0
    for begin, end, name in sorted(spans):
        if begin < end and begin < reach:
            raise ValueError("%s overlaps the tensor before it" % name)
        reach = max(reach, end)
    return meta, tensors


def own_projections(model, ids):
    """{"layer.L.q"/"k"/"v": [heads or kv_heads, tokens, head_dim]} by a forward pass of ours."""
    out = {}
    with torch.no_grad():
        x = model.model.embed_tokens(ids)
        for L, layer in enumerate(model.model.layers):
            a = layer.self_attn
            y = layer.norm(x)[0]
            for key, proj in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj)):
                t = proj(y)
                out["layer.%d.%s" % (L, key)] = t.reshape(t.shape[0], -1, a.head_dim).transpose(0, 1).numpy()
            x = layer(x)
    return out


# ---------------------------------------------------------------- the census reference

def census_reference(tensors, sink, local, causal):
    """Per layer a list per head of the census statistics, in float64 from the file's FP16
    q and k (the same numbers the page sends), by materialising each head's matrix."""
    layers = []
    L = 0
    while "layer.%d.q" % L in tensors:
        q = tensors["layer.%d.q" % L].astype(np.float64)
        k = tensors["layer.%d.k" % L].astype(np.float64)
        heads, t, d = q.shape
        rep = heads // k.shape[0]
        rows = []
        for h in range(heads):
            s = q[h] @ k[h // rep].T / math.sqrt(d)
            if causal:
                s[np.triu_indices(t, 1)] = -np.inf
            w = np.exp(s - s.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                ent = -np.where(w > 0, w * np.log(w), 0.0).sum(axis=1)
            i, j = np.indices(w.shape)
            rows.append({
                "entropy": float(ent.mean()),
                "sink": float(w[:, :sink].sum(axis=1).mean()),
                "local": float(np.where(np.abs(i - j) <= local, w, 0).sum(axis=1).mean()),
                "prev": float(np.diagonal(w, -1).mean()) if t > 1 else 0.0,
                "max": float(w.max(axis=1).mean()),
                "received": w.sum(axis=0).tolist(),
            })
        layers.append(rows)
        L += 1
    return layers


# ---------------------------------------------------------------- the cache policies' reference

def top_keep(scores, want):
    """Indices (ascending) of the `want` highest scores; of equal ones the earlier stays."""
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
    return sorted(order[:want])


def policy_keep(policy, positions, scores, appended, prompt, boundary):
    """The rules of a cache policy (docs/contract.md, Sequences), written here from their
    text: which of the cached keys (positions, ascending; scores: each key's H2O total, or
    SnapKV's observation at its prompt) stay after a step that brought the keys up to
    `appended`.  Returns the kept positions."""
    n, kind = len(positions), policy["cache_policy"]
    if kind == "full":
        return list(positions)
    if kind == "window":
        return [p for p in positions if p < policy["cache_sink"] or p >= appended - policy["cache_window"]]
    if kind == "h2o":
        budget, recent = policy["cache_budget"], policy["cache_recent"]
        c = n - min(n, recent)                      # the last `recent` keys always stay
        if n <= budget:
            return list(positions)
        return [positions[j] for j in top_keep(scores[:c], budget - recent)] + list(positions[c:])
    if kind == "snapkv":
        if not prompt:
            return [p for p in positions if p < boundary or p >= appended - policy["cache_window"]]
        c = sum(1 for p in positions if p < boundary)
        half = policy["cache_pool"] // 2
        pooled = [max(scores[max(0, j - half):min(c, j + half + 1)]) for j in range(c)]
        return [positions[j] for j in top_keep(pooled, policy["cache_budget"] - policy["cache_window"])] + list(positions[c:])
    raise ValueError("no policy %r" % kind)


def replay_reference(q, k, v, policy, prompt):
    """One head replayed as the Generation view replays it: the first `prompt` tokens as the
    sequence's first step, then one token a step, causal; the policy's cache beside the full
    one, in float64 from the file's FP16 numbers.  Returns per step {kept: positions after
    the trim, lost_mass and output_error: per query of the step}."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    t, d = q.shape
    scale = 1 / math.sqrt(d)
    cache, totals, steps = [], {}, []
    boundary = max(prompt - policy.get("cache_window", 0), 0)
    starts = [0] + list(range(prompt, t))
    for s, a in enumerate(starts):
        b = prompt if s == 0 else a + 1
        seen = cache + list(range(a, b))
        lost, err, weights = [], [], np.zeros(len(seen))
        observe = np.zeros(len(seen))
        for i in range(a, b):
            cols = [p for p in seen if p <= i]
            sc = q[i] @ k[cols].T * scale
            w = np.exp(sc - sc.max()); w /= w.sum()
            full = q[i] @ k[:i + 1].T * scale
            wf = np.exp(full - full.max()); wf /= wf.sum()
            o, of = w @ v[cols], wf @ v[:i + 1]
            kept = set(cols)
            lost.append(float(sum(wf[p] for p in range(i + 1) if p not in kept)))
            norm = np.linalg.norm(of)
            err.append(float(np.linalg.norm(o - of) / norm if norm > 0 else np.linalg.norm(o - of)))
            at = [seen.index(p) for p in cols]
            weights[at] += w
            if i >= b - min(policy.get("cache_window", 0), b - a):
                observe[at] += w                       # SnapKV's observation window: the last queries
        for p, x in zip(seen, weights):
            totals[p] = totals.get(p, 0.0) + x
        kind = policy["cache_policy"]
        scores = list(observe) if kind == "snapkv" else [totals[p] for p in seen]
        cache = policy_keep(policy, seen, scores, b, s == 0, boundary)
        totals = {p: totals[p] for p in cache}
        steps.append({"kept": cache, "lost_mass": lost, "output_error": err})
    return steps


def generation_reference(tensors, policy, prompt):
    """Per layer a list per head of replay_reference, and the policy census's cell: the mean
    lost_mass over the queries of the steps after the first."""
    layers, L = [], 0
    while "layer.%d.q" % L in tensors:
        q, k, v = (tensors["layer.%d.%s" % (L, x)] for x in "qkv")
        rep = q.shape[0] // k.shape[0]
        rows = []
        for h in range(q.shape[0]):
            steps = replay_reference(q[h], k[h // rep], v[h // rep], policy, prompt)
            later = [x for st in steps[1:] for x in st["lost_mass"]]
            rows.append({"steps": steps, "mean_lost_mass": float(np.mean(later)) if later else 0.0})
        layers.append(rows)
        L += 1
    return layers


# ---------------------------------------------------------------- the checks

RESULTS = {"passed": 0, "failed": 0}


def check(name, fn, only):
    if only and only not in name:
        return
    try:
        fn()
        RESULTS["passed"] += 1
        print("ok %s" % name, flush=True)
    except Exception as e:   # a failed check is reported and the next one runs
        RESULTS["failed"] += 1
        print("FAIL %s: %s: %s" % (name, type(e).__name__, e), flush=True)


def check_capture(layers, heads, kv_heads, dim, tokens):
    def run():
        work = tempfile.mkdtemp(prefix="viz-capture-")
        try:
            model, ids, words = build(layers, heads, kv_heads, dim, tokens, seed=7)
            meta, tensors = read_safetensors(run_block(work, model, ids, words, heads))
            assert json.loads(meta["tokens"]) == words, "tokens: %r" % meta.get("tokens")
            want = own_projections(model, ids)
            assert sorted(tensors) == sorted(want), "tensors %s, not %s" % (sorted(tensors), sorted(want))
            for name, ref in want.items():
                got = tensors[name]
                assert got.dtype == np.float16 and got.shape == ref.shape, \
                    "%s: %s %s, not float16 %s" % (name, got.dtype, got.shape, ref.shape)
                # the file holds the projection rounded to FP16, nothing else
                assert np.array_equal(got, ref.astype(np.float16)), \
                    "%s differs from the model's projection by up to %g" % (
                        name, float(np.abs(got.astype(np.float64) - ref).max()))
            raw = open(os.path.join(work, "capture.safetensors"), "rb").read()
            assert (8 + struct.unpack("<Q", raw[:8])[0]) % 8 == 0, "the data does not start 8-byte aligned"
        finally:
            shutil.rmtree(work)
    return run


def check_reference_rules():
    """The reference's own definitions, on a case worked by hand: 3 tokens, one head."""
    q = np.array([[[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]], dtype=np.float16)
    k = np.array([[[0.0, 0.0], [2.0, 0.0], [0.0, 1.0]]], dtype=np.float16)
    got = census_reference({"layer.0.q": q, "layer.0.k": k}, sink=1, local=0, causal=True)[0][0]
    s = math.sqrt(2)
    w1 = np.array([1, math.exp(2 / s)]) / (1 + math.exp(2 / s))            # query 1: keys 0, 1
    w2 = np.array([1, 1, math.exp(2 / s)]) / (2 + math.exp(2 / s))         # query 2: keys 0..2
    ent = [0.0, -(w1 * np.log(w1)).sum(), -(w2 * np.log(w2)).sum()]
    want = {"entropy": np.mean(ent), "sink": np.mean([1, w1[0], w2[0]]),
            "local": np.mean([1, w1[1], w2[2]]), "prev": np.mean([w1[0], w2[1]]),
            "max": np.mean([1, w1.max(), w2.max()])}
    for key, v in want.items():
        assert abs(got[key] - v) < 1e-12, "%s: %r, not %r" % (key, got[key], v)
    assert np.allclose(got["received"], [1 + w1[0] + w2[0], w1[1] + w2[1], w2[2]], rtol=0, atol=1e-12)


def check_policy_rules():
    """The policies' reference on cases worked by hand: ties, the window, H2O's totals."""
    assert top_keep([1, 2, 2, 1], 1) == [1], "of equal scores the earlier stays"
    assert top_keep([3, 1, 1, 3], 2) == [0, 3]
    assert policy_keep({"cache_policy": "window", "cache_sink": 1, "cache_window": 2},
                       [0, 1, 2, 3, 4], None, 5, False, 0) == [0, 3, 4]
    # SnapKV at its prompt: pooled over 3, key 1's 0.9 lifts keys 0 to 2; keys 4, 5 observed
    snap = {"cache_policy": "snapkv", "cache_window": 2, "cache_budget": 4, "cache_pool": 3}
    assert policy_keep(snap, [0, 1, 2, 3, 4, 5], [0, .9, 0, .5, 0, 0], 6, True, 4) == [0, 1, 4, 5]
    assert policy_keep(snap, [0, 1, 4, 5, 6], None, 7, False, 4) == [0, 1, 5, 6]
    # q = 0: every query spreads evenly, so a key's total is sum over i >= p of 1/(i+1)
    q, k, v = np.zeros((5, 2)), np.eye(5, 2), np.arange(10.0).reshape(5, 2)
    steps = replay_reference(q, k, v, {"cache_policy": "h2o", "cache_budget": 3, "cache_recent": 1}, 1)
    assert [s["kept"] for s in steps] == [[0], [0, 1], [0, 1, 2], [0, 1, 3], [0, 1, 4]], steps
    # step 3 (query 3) saw keys 0, 1, 2, 3 of the full 0..3: nothing lost yet; query 4 lost key 2
    assert steps[3]["lost_mass"] == [0.0] and abs(steps[4]["lost_mass"][0] - 0.2) < 1e-12


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="")
    ap.add_argument("--write")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sink", type=int, default=4)
    ap.add_argument("--local", type=int, default=16)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--cache-policy", help="also replay every head through this policy (reference.json's generation)")
    ap.add_argument("--cache-sink", type=int, default=4)
    ap.add_argument("--cache-window", type=int, default=8)
    ap.add_argument("--cache-budget", type=int, default=16)
    ap.add_argument("--cache-recent", type=int, default=8)
    ap.add_argument("--cache-pool", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=1, help="tokens of the replay's first step")
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.write:
        os.makedirs(a.write, exist_ok=True)
        model, ids, words = build(a.layers, a.heads, a.kv_heads or a.heads, a.dim, a.tokens, a.seed)
        path = run_block(a.write, model, ids, words, a.heads)
        if not a.no_reference:
            _, tensors = read_safetensors(path)
            ref = {"tokens": words, "sink": a.sink, "local": a.local, "causal": not a.no_causal,
                   "layers": census_reference(tensors, a.sink, a.local, not a.no_causal)}
            if a.cache_policy:
                names = {"window": ("cache_sink", "cache_window"), "h2o": ("cache_budget", "cache_recent"),
                         "snapkv": ("cache_window", "cache_budget", "cache_pool"), "full": ()}[a.cache_policy]
                policy = {"cache_policy": a.cache_policy, **{n: getattr(a, n) for n in names}}
                ref["generation"] = {"policy": policy, "prompt": a.prompt,
                                     "layers": generation_reference(tensors, policy, a.prompt)}
            with open(os.path.join(a.write, "reference.json"), "w") as f:
                json.dump(ref, f)
        print(path)
        return 0
    check("capture/the document's lines write every layer's q, k and v, FP16, tokens in the metadata",
          check_capture(3, 4, 4, 32, 40), a.filter)
    check("capture/grouped-query attention: k and v with fewer heads than q",
          check_capture(2, 4, 2, 32, 24), a.filter)
    check("capture/the census reference on a case worked by hand", check_reference_rules, a.filter)
    check("capture/the cache policies' reference on cases worked by hand", check_policy_rules, a.filter)
    print("%d passed, %d failed" % (RESULTS["passed"], RESULTS["failed"]))
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
