// conformance.mjs - checks that the server's answers follow api/openapi.yaml.
//
// Starts the server (the binary named on the command line) on a free loopback
// port and Stoplight Prism as a validating proxy in front of it (`prism proxy
// --errors`, pinned by tests/prism/package-lock.json), then sends a
// representative set of v1 and v2 requests through Prism: every endpoint, its
// success answers and its error answers.  Prism checks each request and each
// answer against the description; with --errors it replaces an answer that
// violates it by an application/problem+json error.  A case fails when the
// status is not the one expected, when Prism reports a violation (its error
// body, or an sl-violations header), or when the answer's own check fails.
// Prints "ok NAME" or "FAIL NAME: why" per case and "N passed, N failed".
//
// Prism reads request bodies as UTF-8 text before it forwards them (it is a
// validator, not a byte-transparent proxy), so a byte that does not belong to
// a UTF-8 sequence would reach the server as U+FFFD.  The binary tensors sent
// here are therefore made of numbers whose little-endian bytes are all below
// 0x80 in both FP32 and FP64 (2, 2.5, 3, 8); tests/integration/v2test.c sends
// arbitrary binary tensors to the server directly.
//
// HEAD requests are left out: Prism parses the empty body of a HEAD answer
// whose Content-Type is application/json as JSON and fails with a 500.
//
// Usage: node tests/prism/conformance.mjs SERVER [SPEC]   (from the repository root)
// With TEST_FILTER=SUBSTR in the environment (tests/run.sh --filter) only the cases whose
// name contains SUBSTR run; with none, it prints "0 passed, 0 failed" and starts nothing.

import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..');
const serverBin = process.argv[2];
const spec = process.argv[3] || join(root, 'api', 'openapi.yaml');
const prismBin = join(here, 'node_modules', '.bin', 'prism');
const STARTUP_MS = 60000;
const REQUEST_MS = 30000;

if (!serverBin) {
    console.log('usage: conformance.mjs SERVER [SPEC]');
    console.log('0 passed, 1 failed');
    process.exit(2);
}

// A free loopback port (closed again before Prism binds it).
function freePort() {
    return new Promise((resolve, reject) => {
        const s = createServer();
        s.on('error', reject);
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

// Starts a child and resolves once a line of its output matches `ready`
// (with the match), rejecting if it exits or takes longer than STARTUP_MS.
function startChild(name, cmd, args, ready) {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let seen = '';
    const promise = new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${name} did not start in time:\n${seen}`)),
                                 STARTUP_MS);
        const onData = (chunk) => {
            seen += chunk.toString();
            const m = seen.match(ready);
            if (m) {
                clearTimeout(timer);
                resolve(m);
            }
        };
        child.stdout.on('data', onData);
        child.stderr.on('data', (chunk) => { seen += chunk.toString(); });
        child.on('exit', (code) => {
            clearTimeout(timer);
            reject(new Error(`${name} exited (status ${code}) before it was ready:\n${seen}`));
        });
    });
    return { child, promise };
}

// Stops a child we started, by its PID, and waits for it.
function stopChild(child) {
    return new Promise((resolve) => {
        if (child.exitCode !== null || child.signalCode !== null) {
            resolve();
            return;
        }
        const timer = setTimeout(() => { process.kill(child.pid, 'SIGKILL'); }, 10000);
        child.on('exit', () => { clearTimeout(timer); resolve(); });
        process.kill(child.pid, 'SIGTERM');
    });
}

// A binary v2 body: the JSON header, then each tensor's little-endian bytes.
// tensors: [{name, shape, datatype, values}]; returns {body, headerLength}.
function binaryBody(tensors, extra = {}) {
    const inputs = [];
    const parts = [];
    for (const t of tensors) {
        let bytes;
        if (t.datatype === 'FP32') {
            bytes = Buffer.alloc(4 * t.values.length);
            t.values.forEach((v, i) => bytes.writeFloatLE(v, 4 * i));
        } else if (t.datatype === 'FP64') {
            bytes = Buffer.alloc(8 * t.values.length);
            t.values.forEach((v, i) => bytes.writeDoubleLE(v, 8 * i));
        } else {
            bytes = Buffer.from(t.values.map((v) => (v ? 1 : 0)));
        }
        inputs.push({ name: t.name, shape: t.shape, datatype: t.datatype,
                      parameters: { binary_data_size: t.size ?? bytes.length } });
        parts.push(bytes);
    }
    const header = Buffer.from(JSON.stringify({ ...extra, inputs }));
    const body = Buffer.concat([header, ...parts]);
    for (const b of body.subarray(header.length))
        if (b >= 0x80)
            throw new Error('a binary test tensor holds a byte >= 0x80, which Prism would alter');
    return { body, headerLength: header.length };
}

// A safetensors file of F64 matrices {name: rows}: 8-byte header length, JSON header, data.
// Prism passes request bodies on as UTF-8 text, so every byte must be below 0x80: the header
// is padded to 264 bytes (0x108) and the values must be such as 0, 2, 3, 4 or 8.
function safetensors(tensors) {
    const header = {};
    const parts = [];
    let offset = 0;
    for (const [name, rows] of Object.entries(tensors)) {
        const flat = rows.flat();
        const buf = Buffer.alloc(flat.length * 8);
        flat.forEach((v, i) => buf.writeDoubleLE(v, i * 8));
        header[name] = { dtype: 'F64', shape: [rows.length, rows[0].length],
                         data_offsets: [offset, offset + buf.length] };
        parts.push(buf);
        offset += buf.length;
    }
    const text = Buffer.from(JSON.stringify(header).padEnd(264, ' '));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(text.length));
    return Buffer.concat([len, text, ...parts]);
}
const octets = (buf) => ({ body: buf, headers: { 'Content-Type': 'application/octet-stream' } });

const json = (v) => ({ body: JSON.stringify(v), headers: { 'Content-Type': 'application/json' } });

function v2json(inputs, extra = {}) {
    return json({ ...extra, inputs });
}

function binaryCase(tensors, extra = {}, headerLengthDelta = 0) {
    const { body, headerLength } = binaryBody(tensors, extra);
    return { body, headers: { 'Content-Type': 'application/octet-stream',
                              'Inference-Header-Content-Length': String(headerLength +
                                                                        headerLengthDelta) } };
}

// Numbers whose float32 and float64 little-endian bytes are all below 0x80.
const SAFE = [2, 2.5, 3, 2, 8, 2.5, 3, 2, 2.5];
const t2 = (name, rows, cols, datatype = 'FP32', offset = 0) => ({
    name, shape: [rows, cols], datatype,
    values: Array.from({ length: rows * cols }, (_, i) => SAFE[(i + offset) % SAFE.length]),
});

const toy = JSON.parse(readFileSync(join(root, 'api', 'examples', 'toy.weight-set.json'), 'utf8'));
const example = (name) => readFileSync(join(root, 'api', 'examples', `${name}.request.json`), 'utf8');
const postExample = (name) => ({ method: 'POST', path: '/v1/attention', body: example(name),
                                 headers: { 'Content-Type': 'application/json' } });
const preflight = (path, method) => ({
    method: 'OPTIONS', path,
    headers: { Origin: 'http://127.0.0.1:9', 'Access-Control-Request-Method': method,
               'Access-Control-Request-Headers': 'content-type, inference-header-content-length' },
});

// Checks on the answer beyond the description: the binary answer's framing.
// Prism also re-encodes answer bodies as text, so cases with this check send
// their request to the server directly as well and check that answer here.
function binaryFraming(res, buf) {
    const n = Number(res.headers.get('inference-header-content-length'));
    if (!Number.isInteger(n) || n <= 0 || n > buf.length)
        return 'no valid Inference-Header-Content-Length on a binary answer';
    const header = JSON.parse(buf.subarray(0, n).toString());
    let bytes = 0;
    for (const o of header.outputs)
        bytes += o.parameters?.binary_data_size ?? 0;
    if (n + bytes !== buf.length)
        return `the outputs' binary_data_size add up to ${bytes}, the body has ${buf.length - n} bytes after the header`;
    return null;
}

const attnInputs = [
    { name: 'q', shape: [2, 2], datatype: 'FP32', data: [0.1, 0.2, 0.3, 0.4] },
    { name: 'k', shape: [3, 2], datatype: 'FP32', data: [[0.5, -0.1], [0.2, 0.3], [0.0, 1.0]] },
    { name: 'v', shape: [3, 1], datatype: 'FP32', data: [1, 2, 3] },
];

const cases = [
    // v1
    ['v1 attention', postExample('mask'), 200],
    ['v1 attention float32', postExample('float32'), 200],
    ['v1 attention batch', postExample('batch'), 200],
    ['v1 attention columns', postExample('columns'), 200],
    ['v1 attention cross', postExample('cross_attention'), 200],
    ['v1 attention heads and wo', postExample('heads_wo'), 200],
    ['v1 attention projections', postExample('seed003_projections'), 200],
    ['v1 attention shape mismatch', { method: 'POST', path: '/v1/attention',
        ...json({ q: [[1, 2]], k: [[1, 2, 3]], v: [[1]] }) }, 400],
    ['v1 attention unknown weight set', { method: 'POST', path: '/v1/attention',
        ...json({ x: [[1, 2, 3]], weights: 'absent' }) }, 404],
    ['v1 attention not JSON', { method: 'POST', path: '/v1/attention',
        body: '{"q": [[1', headers: { 'Content-Type': 'application/json' } }, 400],
    ['v1 attention preflight', preflight('/v1/attention', 'POST'), 204],
    ['healthz', { method: 'GET', path: '/healthz' }, 200],
    ['readyz', { method: 'GET', path: '/readyz' }, 200],
    ['v1 info', { method: 'GET', path: '/v1/info' }, 200],
    ['metrics', { method: 'GET', path: '/metrics' }, 200],
    ['v1 weight-sets put', { method: 'PUT', path: '/v1/weight-sets/toy', ...json(toy) }, [200, 201]],
    ['v1 weight-sets put again', { method: 'PUT', path: '/v1/weight-sets/toy', ...json(toy) }, [200, 201]],
    ['v1 weight-sets put bad shapes', { method: 'PUT', path: '/v1/weight-sets/bad',
        ...json({ wq: [[1, 2]], wk: [[1]], wv: [[1, 2]] }) }, 400],
    ['v1 weight-sets list', { method: 'GET', path: '/v1/weight-sets' }, 200],
    ['v1 weight-set get', { method: 'GET', path: '/v1/weight-sets/toy' }, 200],
    ['v1 weight-set get absent', { method: 'GET', path: '/v1/weight-sets/absent' }, 404],
    ['v1 attention named weights', postExample('named_weights'), 200],
    ['v1 weight-set get safetensors', { method: 'GET', path: '/v1/weight-sets/toy?format=safetensors' }, 200],
    ['v1 weight-set put safetensors', { method: 'PUT',
        path: '/v1/weight-sets/toyst?format=safetensors&preset=names&layout=in_out&wq=wq&wk=wk&wv=wv',
        ...octets(safetensors({ wq: [[2, 0], [3, 4]], wk: [[8, 2], [0, 3]], wv: [[4, 4], [2, 0]] })) },
        [200, 201]],
    ['v1 weight-set put safetensors truncated', { method: 'PUT',
        path: '/v1/weight-sets/toyst?format=safetensors&preset=torch_mha',
        ...octets(Buffer.from([1, 2, 3])) }, 400],
    ['v1 weight-set preflight', preflight('/v1/weight-sets/toy', 'PUT'), 204],
    // v2
    ['v2 server metadata', { method: 'GET', path: '/v2' }, 200],
    ['v2 live', { method: 'GET', path: '/v2/health/live' }, 200],
    ['v2 ready', { method: 'GET', path: '/v2/health/ready' }, 200],
    ['v2 model metadata attention', { method: 'GET', path: '/v2/models/attention' }, 200],
    ['v2 model metadata weight set', { method: 'GET', path: '/v2/models/toy' }, 200],
    ['v2 model metadata version', { method: 'GET', path: '/v2/models/attention/versions/1' }, 200],
    ['v2 model metadata unknown', { method: 'GET', path: '/v2/models/absent' }, 404],
    ['v2 model ready', { method: 'GET', path: '/v2/models/attention/ready' }, 200],
    ['v2 statistics of every model', { method: 'GET', path: '/v2/models/stats' }, 200],
    ['v2 statistics of a model', { method: 'GET', path: '/v2/models/attention/stats' }, 200],
    ['v2 statistics of a version', { method: 'GET', path: '/v2/models/toy/versions/1/stats' }, 200],
    ['v2 statistics unknown model', { method: 'GET', path: '/v2/models/absent/stats' }, 404],
    ['v2 repository index', { method: 'POST', path: '/v2/repository/index', ...json({}) }, 200],
    ['v2 model ready version', { method: 'GET', path: '/v2/models/toy/versions/1/ready' }, 200],
    ['v2 model ready unknown', { method: 'GET', path: '/v2/models/absent/ready' }, 404],
    ['v2 model config', { method: 'GET', path: '/v2/models/attention/config' }, 200],
    ['v2 model config weight set', { method: 'GET', path: '/v2/models/toy/versions/1/config' }, 200],
    ['v2 model config unknown', { method: 'GET', path: '/v2/models/absent/config' }, 404],
    ['v2 infer JSON', { method: 'POST', path: '/v2/models/attention/infer',
        ...v2json(attnInputs, { id: 'c1', parameters: { causal: true } }) }, 200],
    ['v2 infer JSON FP64 output only', { method: 'POST', path: '/v2/models/attention/versions/1/infer',
        ...v2json(attnInputs.map((i) => ({ ...i, datatype: 'FP64' })),
                  { outputs: [{ name: 'output' }] }) }, 200],
    ['v2 infer JSON mask', { method: 'POST', path: '/v2/models/attention/infer',
        ...v2json([...attnInputs, { name: 'mask', shape: [2, 3], datatype: 'BOOL',
                                    data: [true, false, true, true, true, false] }]) }, 200],
    ['v2 infer weight set', { method: 'POST', path: '/v2/models/toy/infer',
        ...v2json([{ name: 'x', shape: [2, 3], datatype: 'FP32', data: [1, 0, 0, 0, 1, 0] }]) }, 200],
    ['v2 infer binary in, JSON out', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 4), t2('k', 3, 4, 'FP32', 1), t2('v', 3, 2, 'FP32', 2)]) }, 200],
    ['v2 infer binary in and out', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 4, 'FP64'), t2('k', 3, 4, 'FP64', 1), t2('v', 3, 2, 'FP64', 2),
                       { name: 'mask', shape: [2, 3], datatype: 'BOOL',
                         values: [1, 1, 0, 1, 0, 1] }],
                      { parameters: { binary_data_output: true, heads: 2 } }),
        check: binaryFraming }, 200],
    ['v2 infer binary attention only', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 2), t2('k', 2, 2, 'FP32', 3), t2('v', 2, 2, 'FP32', 5)],
                      { outputs: [{ name: 'attention', parameters: { binary_data: true } }] }),
        check: binaryFraming }, 200],
    ['v2 infer unknown model', { method: 'POST', path: '/v2/models/absent/infer',
        ...v2json(attnInputs) }, 404],
    ['v2 infer shape mismatch', { method: 'POST', path: '/v2/models/attention/infer',
        ...v2json([attnInputs[0], { ...attnInputs[1], shape: [3, 3], data: [1, 2, 3, 4, 5, 6, 7, 8, 9] },
                   attnInputs[2]]) }, 400],
    ['v2 infer datatype not taken', { method: 'POST', path: '/v2/models/attention/infer',
        ...v2json(attnInputs.map((i) => ({ ...i, datatype: 'INT32' }))) }, 400],
    ['v2 infer header length past body', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 2), t2('k', 2, 2), t2('v', 2, 2)], {}, 1000) }, 400],
    ['v2 infer sizes do not add up', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 2), t2('k', 2, 2), t2('v', 2, 2)], {}, -4) }, 400],
    ['v2 infer size disagrees with shape', { method: 'POST', path: '/v2/models/attention/infer',
        ...binaryCase([t2('q', 2, 2), { ...t2('k', 2, 2), size: 8 }, t2('v', 2, 2)]) }, 400],
    ['v2 infer too large', { method: 'POST', path: '/v2/models/attention/infer',
        ...v2json([{ name: 'q', shape: [100000, 1000], datatype: 'FP32', data: [1] },
                   attnInputs[1], attnInputs[2]]) }, 413],
    ['v2 infer preflight', preflight('/v2/models/attention/infer', 'POST'), 204],
];

async function runCase(base, serverBase, [name, c, expect]) {
    const res = await fetch(base + c.path, { method: c.method, headers: c.headers, body: c.body,
                                             signal: AbortSignal.timeout(REQUEST_MS) });
    const buf = Buffer.from(await res.arrayBuffer());
    const type = res.headers.get('content-type') || '';
    if (type.startsWith('application/problem+json')) {
        const text = buf.toString();
        let detail = text;
        try {
            const p = JSON.parse(text);
            detail = `${p.title}: ${p.detail || ''} ${JSON.stringify(p.validation || [])}`;
        } catch { /* the raw text says it */ }
        return `Prism answered ${res.status}: ${detail.slice(0, 1500)}`;
    }
    const violations = res.headers.get('sl-violations');
    if (violations)
        return `Prism reports violations: ${violations.slice(0, 1500)}`;
    const wanted = Array.isArray(expect) ? expect : [expect];
    if (!wanted.includes(res.status))
        return `status ${res.status}, expected ${wanted.join(' or ')}: ${buf.toString().slice(0, 300)}`;
    if (!c.check)
        return null;
    const direct = await fetch(serverBase + c.path, { method: c.method, headers: c.headers,
                                                      body: c.body,
                                                      signal: AbortSignal.timeout(REQUEST_MS) });
    return c.check(direct, Buffer.from(await direct.arrayBuffer()));
}

async function main() {
    const filter = process.env.TEST_FILTER || '';
    const chosen = cases.filter(([name]) => name.includes(filter));
    if (chosen.length === 0) {
        console.log('0 passed, 0 failed');
        return;
    }
    const dataDir = mkdtempSync(join(tmpdir(), 'attn-conformance-'));
    let server = null;
    let prism = null;
    let passed = 0;
    let failed = 0;
    try {
        const s = startChild('the server', serverBin,
                             ['--host', '127.0.0.1', '--port', '0', '--data-dir', dataDir, '--quiet'],
                             /listening on http:\/\/127\.0\.0\.1:(\d+)/);
        server = s.child;
        const serverPort = Number((await s.promise)[1]);
        const prismPort = await freePort();
        const p = startChild('Prism', prismBin,
                             ['proxy', spec, `http://127.0.0.1:${serverPort}`, '--errors',
                              '--cors', 'false', '--host', '127.0.0.1', '--port',
                              String(prismPort)],
                             /Prism is listening/);
        prism = p.child;
        await p.promise;
        const base = `http://127.0.0.1:${prismPort}`;
        for (const c of chosen) {
            let why;
            try {
                why = await runCase(base, `http://127.0.0.1:${serverPort}`, c);
            } catch (e) {
                why = `request failed: ${e.message}`;
            }
            if (why) {
                console.log(`FAIL ${c[0]}: ${why}`);
                failed++;
            } else {
                console.log(`ok   ${c[0]}`);
                passed++;
            }
        }
    } catch (e) {
        console.log(`FAIL openapi-answers: ${e.message}`);
        failed++;
    } finally {
        if (prism)
            await stopChild(prism);
        if (server)
            await stopChild(server);
        rmSync(dataDir, { recursive: true, force: true });
    }
    console.log(`${passed} passed, ${failed} failed`);
    process.exitCode = failed ? 1 : 0;
}

await main();
