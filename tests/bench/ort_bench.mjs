// ort_bench.mjs - one ONNX Runtime row of bench_ort.sh: checks that ONNX Runtime's answer agrees
// with ours on the very same inputs, then times it.
//
// The inputs are those bench-kernel --case wrote to its check file (raw little-endian doubles:
// q, k, v, our output, then the first CHECK_ROWS query rows of every head's attention), so both
// sides compute the same numbers: float32 rows round the doubles to float32 as attention_run
// does. The model is built here (onnx_model.mjs) and run on the CPU with 2 intra-op threads.
//
// Usage: node ort_bench.mjs --check FILE --op mha|attention23 --dtype float32|float64
//          --batch B --heads H --len L --head-dim D --causal 0|1 --attention 0|1
//          --check-rows R [--bound FILE] [--quick]
// Prints one JSON line {ms, reps, max_diff, scale, tolerance}; exit status 0, or 1 when the
// answers disagree (max |ours - ORT| > tolerance x max |ours|: 1e-4 in float32, 1e-6 in float64)
// or ONNX Runtime fails.  With --bound (our side computed in bfloat16, ONNX Runtime's in float32),
// FILE holds the bound of each of our output numbers against the float64 result (little-endian
// doubles, bf16_bound.py), and each |ours - ORT| may be that plus float32's tolerance x max |ours|.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { attentionModel } from './onnx_model.mjs';

const require = createRequire(new URL('./ort/', import.meta.url));
const ort = require('onnxruntime-node');

const MIN_REPS = 3;
const MAX_REPS = 50;
const BUDGET_MS = 2000; // timed runs go on past MIN_REPS while they took less than this in all
// The tolerances of the other kernel rows (run.sh). ONNX Runtime's float64 Attention agrees with
// a float64 reference only to about 1e-7 of the largest output (ours: 1e-15), so a float64
// tolerance nearer ours would fail the peer, not us.
const TOLERANCE = { float32: 1e-4, float64: 1e-6 };

function parseArgs(argv) {
  const a = { quick: false };
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].replace(/^--/, '').replace(/-(.)/g, (_, c) => c.toUpperCase());
    if (name === 'quick') a.quick = true;
    else a[name] = argv[++i];
  }
  for (const n of ['batch', 'heads', 'len', 'headDim', 'causal', 'attention', 'checkRows']) {
    a[n] = Number(a[n]);
    if (!Number.isInteger(a[n]) || a[n] < 0) throw new Error(`--${n}: a whole number`);
  }
  return a;
}

// max |x - ref| over the pairs, and max |ref|.
function difference(x, ref, count, xOffset = 0, refOffset = 0) {
  let diff = 0;
  let scale = 0;
  for (let i = 0; i < count; i++) {
    const r = ref[refOffset + i];
    diff = Math.max(diff, Math.abs(x[xOffset + i] - r));
    scale = Math.max(scale, Math.abs(r));
  }
  return { diff, scale };
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const file = readFileSync(a.check);
  const doubles = new Float64Array(file.buffer, file.byteOffset, file.byteLength / 8);
  const shape = [a.batch, a.len, a.heads * a.headDim];
  const count = shape[0] * shape[1] * shape[2];
  const Typed = a.dtype === 'float32' ? Float32Array : Float64Array;
  const inputs = {};
  ['q', 'k', 'v'].forEach((n, i) => {
    inputs[n] = new ort.Tensor(a.dtype, Typed.from(doubles.subarray(i * count, (i + 1) * count)), shape);
  });
  const model = attentionModel({ op: a.op, dtype: a.dtype, batch: a.batch, heads: a.heads,
    len: a.len, headDim: a.headDim, causal: a.causal === 1, probabilities: a.attention === 1 });
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: 2, interOpNumThreads: 1, executionMode: 'sequential',
    graphOptimizationLevel: 'all' });

  // The check: the output, and the first rows of every head's weights when they are returned.
  let result = await session.run(inputs);
  let { diff, scale } = difference(result.output.data, doubles, count, 0, 3 * count);
  if (a.attention) {
    const rows = a.checkRows * a.len;
    for (let m = 0; m < a.batch * a.heads; m++) {
      const p = difference(result.probabilities.data, doubles, rows, m * a.len * a.len,
        4 * count + m * rows);
      diff = Math.max(diff, p.diff);
      scale = Math.max(scale, p.scale);
    }
  }
  const tolerance = TOLERANCE[a.dtype];
  let pastBound = false;
  if (a.bound) {
    const b = readFileSync(a.bound);
    const bound = new Float64Array(b.buffer, b.byteOffset, b.byteLength / 8);
    if (bound.length !== count) throw new Error(`--bound: ${bound.length} numbers, not ${count}`);
    for (let i = 0; i < count && !pastBound; i++)
      pastBound = !(Math.abs(result.output.data[i] - doubles[3 * count + i]) <=
                    bound[i] + tolerance * scale);
  }
  if (pastBound || !(a.bound || diff <= tolerance * scale)) {
    console.log(JSON.stringify({ error: 'answers disagree', max_diff: diff, scale, tolerance }));
    process.exit(1);
  }
  result = null;

  const times = [];
  let spent = 0;
  while (times.length < MAX_REPS && (times.length < (a.quick ? 1 : MIN_REPS) ||
                                     (!a.quick && spent < BUDGET_MS))) {
    const t0 = process.hrtime.bigint();
    await session.run(inputs);
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    times.push(ms);
    spent += ms;
  }
  times.sort((x, y) => x - y);
  const n = times.length;
  const median = n % 2 ? times[(n - 1) / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  console.log(JSON.stringify({ ms: median, reps: n, max_diff: diff, scale, tolerance }));
}

main().catch((e) => {
  console.log(JSON.stringify({ error: String(e.message || e) }));
  process.exit(1);
});
