// The check of the check: validate.mjs run on copies of docker/kubernetes, each broken in one
// way that the schemas or the invariants must catch, must fail naming the problem. Each case is
// a file, a text in it, what replaces it, and a text the failure must contain.
import { execFile as execFileCallback } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const execFile = promisify(execFileCallback);

const here = path.dirname(fileURLToPath(import.meta.url));
const root = process.env.OROCHI_KUBERNETES_DIR;
const runtime = "kserve/clusterservingruntime.yaml";
const service = "kserve/inferenceservice.yaml";
const adapter = "prometheus-adapter/values.yaml";
const hpa = "base/horizontalpodautoscaler.yaml";
const cases = [
  [service, "storageUri: s3", "storageURI: s3", "/spec/predictor/model field storageURI"],
  [service, "scaleMetric: cpu", "scaleMetric: gpu", "/spec/predictor/scaleMetric must be equal"],
  [service, "    terminationGracePeriodSeconds: 45\n    model:",
   "    terminationGracePeriodSecond: 45\n    model:", "field terminationGracePeriodSecond"],
  [service, "terminationGracePeriodSeconds: 45", "terminationGracePeriodSeconds: 30",
   "terminationGracePeriodSeconds 30 is not more than 40"],
  [service, "name: h2c", "name: grpc", "grpc-v2 needs the one port h2c 8001"],
  [service, "runtime: kserve-orochi", "runtime: kserve-triton", "on runtime kserve-orochi"],
  [runtime, "containerPort: 8000", 'containerPort: "8000"',
   "/spec/containers/0/ports/0/containerPort type"],
  [runtime, "supportedModelFormats", "supportedModelFormat", "field supportedModelFormat"],
  [runtime, "--model-dir=/mnt/models", "--model-dir=/models", "--model-dir=/mnt/models"],
  [runtime, "--http-port=8000", "--http-port=8080", "the runtime's one port must be http1 8080"],
  [runtime, 'prometheus.kserve.io/port: "8002"', 'prometheus.kserve.io/port: "8080"',
   "prometheus.kserve.io/port and path are not the metrics port"],
  [runtime, "    - grpc-v2\n", "    - grpc-v3\n", "unknown protocol version grpc-v3"],
  [runtime, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "not non-root"],
  [adapter, "as: orochi_queue_depth", "as: orochi_queue_length",
   "the HPA asks for orochi_queue_depth, which no adapter rule publishes"],
  [adapter, "    - seriesQuery", "    - seriesQery", "must have required property 'seriesQuery'"],
  [adapter, "'orochi_queue_depth{", "'orochi_queue_size{", "not a metric of docs/METRICS.md"],
  [adapter, "sum by (<<.GroupBy>>)", "sum bye (<<.GroupBy>>)", "promtool refuses the queries"],
  [adapter, "            resource: pod", "            resource: pods",
   "not published per pod"],
  [hpa, "name: orochi_queue_depth", "name: orochi_queue_length",
   "the HPA asks for orochi_queue_length"],
  ["base/configmap.yaml", '"model_control_mode": "poll"', '"model_control_mode": "explicit"',
   "replicas would not follow the shared repository"],
];

// Runs one case: the failures validate.mjs printed for its broken copy.
async function run([file, text, replacement]) {
  const copy = fs.mkdtempSync(path.join(os.tmpdir(), "orochi-kubernetes-"));
  try {
    fs.cpSync(root, copy, { recursive: true });
    const target = path.join(copy, file);
    const original = fs.readFileSync(target, "utf8");
    if (!original.includes(text)) return `(the case is stale: ${file} has no ${text})`;
    fs.writeFileSync(target, original.replace(text, replacement));
    await execFile("node", [path.join(here, "validate.mjs")], {
      env: { ...process.env, OROCHI_KUBERNETES_DIR: copy, OROCHI_NO_KUBECTL: "1" } });
    return "(validate.mjs passed it)";
  } catch (error) {
    return error.stdout ?? String(error);
  } finally {
    fs.rmSync(copy, { recursive: true });
  }
}

// Two at a time: each is mostly node starting and importing the schemas.
const outputs = [];
for (let i = 0; i < cases.length; i += 2) {
  outputs.push(...await Promise.all(cases.slice(i, i + 2).map(run)));
}
let failed = 0;
cases.forEach(([file, text, replacement, expected], i) => {
  const caught = outputs[i].split("\n").some((line) => line.startsWith("FAIL") &&
                                                       line.includes(expected));
  if (!caught) {
    failed += 1;
    console.log(`FAIL ${file}: ${text} -> ${replacement}: no failure naming "${expected}"\n` +
                outputs[i]);
  }
});
console.log(`selftest: ${cases.length - failed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
