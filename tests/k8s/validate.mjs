// validate.mjs - checks the Kubernetes manifests in docker/k8s/ (make lint-k8s).
//
// Every document is validated against the Kubernetes API schemas that the kubernetes-models
// package carries (types, required fields, enums, formats), through the model class of its
// apiVersion and kind; a kind the package does not know is a failure.  Those schemas allow
// unknown fields, as the API's own OpenAPI does, so the deployment rules that matter here
// are checked by name as well: resources, the liveness probe on /healthz and the readiness
// probe on /readyz or gRPC health on the container's grpc port, a non-root user, a read-only root filesystem, the weight-set volume (with more
// than one replica: a PersistentVolumeClaim of the folder that is ReadWriteMany, since all
// replicas share the directory), and that the Service and the HorizontalPodAutoscaler point
// at the Deployment.
//
// A Deployment that keeps its weight sets in a bucket (ATTN_STORE_URL s3://..., as a value or
// from a ConfigMap of the folder) needs no volume: its rules are instead that the store's
// credentials come from a Secret (secretKeyRef) and that no PersistentVolumeClaim is mounted
// for the weight sets.  No container may carry AWS_SECRET_ACCESS_KEY or AWS_SESSION_TOKEN as
// a literal value.
//
// A variant folder (s3/: the Deployment of replicas that share only a bucket) is not a
// second set of objects: it is checked as the folder above with some files replaced or left
// out (variants, below), so its Deployment meets the same Service, HPA and operators' objects.
//
// The subfolders hold the manifests of operators a cluster may lack (keda/: a KEDA
// ScaledObject; monitoring/: a prometheus-operator ServiceMonitor), validated against the
// schemas of @kubernetes-models/keda and @kubernetes-models/prometheus-operator and checked
// with the rest: the ScaledObject scales the Deployment, takes over its HPA, scales on the
// queue wait with a CPU trigger as the fallback; the ServiceMonitor scrapes /metrics through
// a port the Service has.
//
// Every file in tests/k8s/bad/ (and its subfolders) must be rejected, so that a validator
// that accepts everything fails this suite.  Output: "ok NAME" or "FAIL NAME: why" per check, then
// "N passed, N failed".
//
//   node tests/k8s/validate.mjs docker/k8s tests/k8s/bad
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { parseAllDocuments } from "yaml";

let passed = 0;
let failed = 0;
// TEST_FILTER=SUBSTR in the environment (tests/run.sh --filter): only the checks whose name
// contains SUBSTR run and are reported.
const filter = process.env.TEST_FILTER || "";
const selected = (name) => name.includes(filter);
const ok = (name) => { console.log(`ok   ${name}`); passed++; };
const fail = (name, why) => { console.log(`FAIL ${name}: ${why}`); failed++; };

// The *.yaml files under DIR, subfolders included, as paths relative to DIR.
function yamlFiles(dir) {
    return readdirSync(dir, { recursive: true }).filter((f) => f.endsWith(".yaml")).sort();
}

// The variant folders of the good folder: each is checked as the folder with the files of
// `replaces` taken from the variant, those of `drops` left out, and the variant's other files
// added (docs/deployment.md says how each is applied).
const variants = [
    { dir: "s3", replaces: ["deployment.yaml"], drops: ["pvc.yaml"] },
];
const inVariant = (file) => variants.some((v) => file.startsWith(`${v.dir}/`));

// Reads every *.yaml document under DIR as [{file, doc}] (keep: which files to read).
function readManifests(dir, keep = () => true) {
    const out = [];
    for (const file of yamlFiles(dir).filter(keep)) {
        for (const d of parseAllDocuments(readFileSync(join(dir, file), "utf8"))) {
            if (d.errors.length) throw new Error(`${file}: ${d.errors[0].message}`);
            const doc = d.toJSON();
            if (doc !== null) out.push({ file, doc });
        }
    }
    return out;
}

// The packages that carry the schemas of the custom resources, by API group; the others
// are Kubernetes' own, in kubernetes-models.
const crdPackages = {
    "keda.sh": "@kubernetes-models/keda",
    "monitoring.coreos.com": "@kubernetes-models/prometheus-operator",
};

// Validates one document against its schema; returns null or the reason it is invalid.
async function schemaError(doc) {
    const [group, version] = doc.apiVersion.includes("/") ? doc.apiVersion.split("/") : [null, doc.apiVersion];
    let models;
    try {
        const pkg = crdPackages[group];
        models = await import(pkg ? `${pkg}/${group}/${version}` :
            group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`);
    } catch {
        return `unknown apiVersion ${doc.apiVersion}`;
    }
    const Model = models[doc.kind];
    if (!Model) return `unknown kind ${doc.kind} in ${doc.apiVersion}`;
    try {
        new Model(doc).validate();
        return null;
    } catch (e) {
        return e.message.split("\n")[0];
    }
}

// The deployment rules; returns the list of broken ones (empty when all hold).
function policyErrors(docs) {
    const errors = [];
    const byKind = (kind) => docs.filter((d) => d.kind === kind);
    const deployments = byKind("Deployment");
    if (deployments.length !== 1) return [`expected one Deployment, found ${deployments.length}`];
    const dep = deployments[0];
    const pod = dep.spec?.template?.spec ?? {};
    const labels = dep.spec?.template?.metadata?.labels ?? {};
    const c = (pod.containers ?? [])[0] ?? {};
    const sc = c.securityContext ?? {};
    const psc = pod.securityContext ?? {};
    const probe = (p, path) => p?.httpGet?.path === path;
    if (!c.resources?.requests?.cpu || !c.resources?.requests?.memory) errors.push("no cpu and memory requests");
    if (!c.resources?.limits?.memory) errors.push("no memory limit");
    if (!probe(c.livenessProbe, "/healthz")) errors.push("the liveness probe is not GET /healthz");
    // The gRPC health service answers what /readyz does (docs/grpc.md), on the grpc port.
    const grpcPort = (c.ports ?? []).find((p) => p.name === "grpc")?.containerPort;
    const grpcReady = c.readinessProbe?.grpc?.port !== undefined &&
        c.readinessProbe.grpc.port === grpcPort;
    if (!probe(c.readinessProbe, "/readyz") && !grpcReady)
        errors.push("the readiness probe is neither GET /readyz nor gRPC health on the grpc port");
    if (!(sc.runAsNonRoot ?? psc.runAsNonRoot)) errors.push("runAsNonRoot is not set");
    if ((sc.runAsUser ?? psc.runAsUser) === 0) errors.push("runAsUser is 0");
    if (sc.readOnlyRootFilesystem !== true) errors.push("the root filesystem is not read-only");
    const env = c.env ?? [];
    for (const e of env)
        if (["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"].includes(e.name) && e.value !== undefined)
            errors.push(`${e.name} is written in the manifest: take it from a Secret (secretKeyRef)`);
    const mount = (c.volumeMounts ?? []).find((m) => m.mountPath === "/var/lib/attention");
    const volume = mount && (pod.volumes ?? []).find((v) => v.name === mount.name);
    if (storeUrl(env, byKind("ConfigMap")).startsWith("s3://")) {
        // The replicas share the bucket: the credentials must come from a Secret, and a
        // claim would only tie the pods to a node for nothing.
        for (const name of ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
            if (!env.find((e) => e.name === name)?.valueFrom?.secretKeyRef?.name)
                errors.push(`${name} does not come from a Secret (secretKeyRef)`);
        if (volume?.persistentVolumeClaim)
            errors.push("a PersistentVolumeClaim is mounted for the weight sets, which are in the bucket");
    } else {
        if (!volume)
            errors.push("no volume is mounted on /var/lib/attention for the weight sets");
        const claimName = volume?.persistentVolumeClaim?.claimName;
        const claim = byKind("PersistentVolumeClaim").find((p) => p.metadata?.name === claimName);
        if (volume && (dep.spec?.replicas ?? 1) > 1 &&
            !(claim?.spec?.accessModes ?? []).includes("ReadWriteMany"))
            errors.push("the replicas do not share the weight sets: mount a ReadWriteMany PersistentVolumeClaim of this folder");
    }
    const grace = Number((c.args ?? [])[(c.args ?? []).indexOf("--shutdown-grace") + 1] ?? 10);
    if ((pod.terminationGracePeriodSeconds ?? 30) <= grace)
        errors.push("terminationGracePeriodSeconds leaves no time after --shutdown-grace");
    const selects = (sel) => sel && Object.entries(sel).every(([k, v]) => labels[k] === v);
    const services = byKind("Service");
    if (services.length !== 1 || !selects(services[0].spec?.selector))
        errors.push("no Service selects the Deployment's pods");
    const hpas = byKind("HorizontalPodAutoscaler");
    const ref = hpas[0]?.spec?.scaleTargetRef;
    if (hpas.length !== 1 || ref?.kind !== "Deployment" || ref?.name !== dep.metadata?.name)
        errors.push("no HorizontalPodAutoscaler scales the Deployment");
    for (const so of byKind("ScaledObject")) errors.push(...scaledObjectErrors(so, dep, hpas[0]));
    for (const sm of byKind("ServiceMonitor")) errors.push(...serviceMonitorErrors(sm, services[0]));
    return errors;
}

// ATTN_STORE_URL of the container's env: its value, or the key of a ConfigMap of the folder
// it refers to; "" when there is none.
function storeUrl(env, configMaps) {
    const e = env.find((x) => x.name === "ATTN_STORE_URL");
    if (e?.value !== undefined) return String(e.value);
    const ref = e?.valueFrom?.configMapKeyRef;
    const map = ref && configMaps.find((m) => m.metadata?.name === ref.name);
    return String(map?.data?.[ref?.key] ?? "");
}

// The rules of a KEDA ScaledObject: it scales the Deployment, adopts the HPA (two
// autoscalers on one Deployment would undo each other's changes), scales on the queue wait
// and keeps CPU as the fallback.
function scaledObjectErrors(so, dep, hpa) {
    const errors = [];
    const name = `ScaledObject ${so.metadata?.name}`;
    const ref = so.spec?.scaleTargetRef ?? {};
    if ((ref.kind ?? "Deployment") !== "Deployment" || ref.name !== dep.metadata?.name)
        errors.push(`${name} does not scale the Deployment`);
    if (so.metadata?.annotations?.["scaledobject.keda.sh/transfer-hpa-ownership"] !== "true" ||
        so.spec?.advanced?.horizontalPodAutoscalerConfig?.name !== hpa?.metadata?.name)
        errors.push(`${name} does not take over the HorizontalPodAutoscaler ${hpa?.metadata?.name}`);
    const triggers = so.spec?.triggers ?? [];
    const wait = triggers.find((t) => t.type === "prometheus");
    if (!/attention_queue_wait_seconds_(sum|count|bucket)\b/.test(wait?.metadata?.query ?? ""))
        errors.push(`${name} has no prometheus trigger on attention_queue_wait_seconds`);
    if (!triggers.some((t) => t.type === "cpu"))
        errors.push(`${name} has no cpu trigger to fall back on`);
    return errors;
}

// The rules of a ServiceMonitor: it selects the Service and scrapes /metrics on one of its
// named ports.
function serviceMonitorErrors(sm, service) {
    const errors = [];
    const name = `ServiceMonitor ${sm.metadata?.name}`;
    const want = sm.spec?.selector?.matchLabels ?? {};
    const labels = service?.metadata?.labels ?? {};
    if (!Object.keys(want).length || !Object.entries(want).every(([k, v]) => labels[k] === v))
        errors.push(`${name} does not select the Service`);
    const ports = (service?.spec?.ports ?? []).map((p) => p.name);
    const endpoints = sm.spec?.endpoints ?? [];
    if (!endpoints.length || !endpoints.every((e) => ports.includes(e.port) && (e.path ?? "/metrics") === "/metrics"))
        errors.push(`${name} does not scrape /metrics on a port of the Service (${ports.join(", ")})`);
    return errors;
}

// Checks a folder: the schema of each document and, with rules, the deployment rules.
// Returns the number of problems found (each is also reported when report is true).
// The first problem of the last folder checked, for the report of a rejected bad example.
let firstProblem = "";

async function checkFolder(dir, report) {
    let problems = 0;
    firstProblem = "";
    const note = (name, why) => {
        if (problems++ === 0) firstProblem = `${name.replace(dir, "")}: ${why}`;
        if (report) fail(name, why);
    };
    let docs;
    try {
        docs = readManifests(dir);
    } catch (e) {
        note(`${dir}/parse`, e.message);
        return problems;
    }
    for (const { file, doc } of docs) {
        const name = `schema ${file} ${doc.kind}/${doc.metadata?.name}`;
        if (report && !selected(name)) continue;
        const err = await schemaError(doc);
        if (err) note(name, err);
        else if (report) ok(name);
    }
    // The folder itself, then each variant of it that is there.
    const sets = [{ label: `rules ${dir}`, docs: docs.filter((d) => !inVariant(d.file)) }];
    for (const v of variants) {
        const own = docs.filter((d) => d.file.startsWith(`${v.dir}/`));
        if (!own.length) continue;
        const left = [...v.replaces, ...v.drops];
        sets.push({ label: `rules ${dir} with ${v.dir}/`,
                    docs: [...sets[0].docs.filter((d) => !left.includes(d.file)), ...own] });
    }
    for (const set of sets) {
        if (report && !selected(set.label)) continue;
        const before = problems;
        for (const why of policyErrors(set.docs.map((d) => d.doc))) note(set.label, why);
        if (report && problems === before) ok(set.label);
    }
    return problems;
}

const [goodDir, badDir] = process.argv.slice(2);
await checkFolder(goodDir, true);
// Each bad example is the good folder with one file replaced (bad/keda/scaledobject--x.yaml
// replaces keda/scaledobject.yaml); it must fail somewhere.
for (const file of yamlFiles(badDir)) {
    if (!selected(`rejects bad/${file}`)) continue;
    const { mkdtempSync, copyFileSync, cpSync, rmSync } = await import("node:fs");
    const { tmpdir } = await import("node:os");
    const dir = mkdtempSync(join(tmpdir(), "k8s-bad-"));
    cpSync(goodDir, dir, { recursive: true });
    const target = join(dirname(file), file.split("/").pop().split("--")[0] + ".yaml");
    copyFileSync(join(badDir, file), join(dir, target));
    const problems = await checkFolder(dir, false);
    rmSync(dir, { recursive: true });
    if (problems > 0) ok(`rejects bad/${file} (${firstProblem})`);
    else fail(`rejects bad/${file}`, `accepted with ${target} replaced by it`);
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
