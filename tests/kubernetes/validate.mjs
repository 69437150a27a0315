// Validates the Kubernetes manifests of docker/kubernetes offline: every overlay is rendered
// (the subset of kustomize they use), each object is checked against the Kubernetes API schema
// of its kind (kubernetes-models, and @kubernetes-models/prometheus-operator for the
// PodMonitor; versions pinned in package.json and package-lock.json), and then against what
// the server needs (ports, probes, security, grace periods; see checkInvariants).
//
// kustomize itself is not in Debian or npm, so the rendering is done here; a kustomization key
// it does not know fails the check rather than being skipped. Where `kubectl` is on PATH its
// `kustomize` output is compared with ours too.
//
// Limitation: the API schemas do not forbid unknown fields (the Kubernetes OpenAPI schemas leave
// additionalProperties open), so a misspelt optional field passes the schema check; the
// invariants below catch the ones that matter.
//
// KServe (docker/kubernetes/kserve) has no npm package of its types: its ClusterServingRuntime
// and InferenceService are checked with ajv (pinned) against kserve-crds.schema.json, a JSON
// schema written from the facts of KServe's CRD OpenAPI schemas, whose Kubernetes-typed fields
// (containers, volumes, a predictor's pod spec) go to kubernetes-models' validators; then against
// what the server needs (checkKServe). prometheus-adapter's rules
// (docker/kubernetes/prometheus-adapter) are checked against prometheus-adapter-rules.schema.json
// and against the HPA and the PodMonitor (checkAdapter).

import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import YAML from "yaml";

const here = path.dirname(fileURLToPath(import.meta.url));
// OROCHI_KUBERNETES_DIR: another tree to check (the check of this check uses broken copies).
const root = process.env.OROCHI_KUBERNETES_DIR ??
  path.resolve(here, "..", "..", "docker", "kubernetes");
const failures = [];
const fail = (where, message) => failures.push(`${where}: ${message}`);

// --- rendering ---------------------------------------------------------------------------------

function readDocuments(file) {
  return YAML.parseAllDocuments(fs.readFileSync(file, "utf8")).map((document) => {
    if (document.errors.length > 0) throw new Error(`${file}: ${document.errors[0].message}`);
    return document.toJS();
  }).filter((object) => object !== null);
}

const key = (object) => `${object.kind}/${object.metadata?.name}`;

// A strategic merge as kustomize applies it to what these manifests patch: maps merge, lists of
// objects with a `name` merge item by item on it, anything else is replaced.
function merge(target, patch) {
  if (Array.isArray(patch)) {
    if (!Array.isArray(target) || !patch.every((item) => item && typeof item === "object" &&
                                               "name" in item)) {
      return structuredClone(patch);
    }
    const merged = structuredClone(target);
    for (const item of patch) {
      const index = merged.findIndex((existing) => existing.name === item.name);
      if (index >= 0) merged[index] = merge(merged[index], item);
      else merged.push(structuredClone(item));
    }
    return merged;
  }
  if (patch && typeof patch === "object") {
    const merged = target && typeof target === "object" && !Array.isArray(target)
      ? structuredClone(target) : {};
    for (const [field, value] of Object.entries(patch)) merged[field] = merge(merged[field], value);
    return merged;
  }
  return patch;
}

function render(directory) {
  const kustomization = readDocuments(path.join(directory, "kustomization.yaml"))[0];
  const known = new Set(["apiVersion", "kind", "resources", "images", "patches"]);
  for (const field of Object.keys(kustomization)) {
    if (!known.has(field)) {
      throw new Error(`${directory}: kustomization field ${field} unsupported`);
    }
  }
  let objects = [];
  for (const resource of kustomization.resources ?? []) {
    const resolved = path.join(directory, resource);
    objects.push(...(fs.statSync(resolved).isDirectory() ? render(resolved)
                                                           : readDocuments(resolved)));
  }
  for (const patch of kustomization.patches ?? []) {
    if (Object.keys(patch).some((field) => field !== "path")) {
      throw new Error(`${directory}: only patches with a path are supported`);
    }
    for (const change of readDocuments(path.join(directory, patch.path))) {
      const index = objects.findIndex((object) => key(object) === key(change));
      if (index < 0) throw new Error(`${directory}: ${patch.path} patches no ${key(change)}`);
      objects[index] = merge(objects[index], change);
    }
  }
  for (const image of kustomization.images ?? []) {
    for (const object of objects) {
      for (const container of object.spec?.template?.spec?.containers ?? []) {
        if (container.image === image.name || container.image.startsWith(`${image.name}:`)) {
          container.image = `${image.newName ?? image.name}:${image.newTag ?? "latest"}`;
        }
      }
    }
  }
  return objects;
}

// --- the API schemas ---------------------------------------------------------------------------

async function modelFor(object) {
  const [group, version] = object.apiVersion.includes("/")
    ? object.apiVersion.split("/") : [null, object.apiVersion];
  const module = group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/${group}/${version}`
    : `kubernetes-models/${group ? `${group}/` : ""}${version}`;
  const exports = await import(module);
  if (!exports[object.kind]) throw new Error(`no schema for ${object.apiVersion} ${object.kind}`);
  return exports[object.kind];
}

async function validateSchemas(where, objects) {
  for (const object of objects) {
    try {
      const Model = await modelFor(object);
      new Model(object).validate();
    } catch (error) {
      fail(`${where} ${key(object)}`, error.message);
    }
  }
}

// --- what the server needs ---------------------------------------------------------------------

function checkInvariants(where, objects) {
  const find = (kind, name) => objects.find((o) => o.kind === kind && o.metadata.name === name);
  const configMap = find("ConfigMap", "orochi-config");
  const deployment = find("Deployment", "orochi");
  if (!configMap || !deployment) return fail(where, "no orochi-config ConfigMap or Deployment");
  const config = JSON.parse(configMap.data["orochi.json"]);
  const http = config.http ?? {};
  const ports = {
    http: http.inference_port ?? 8000, grpc: config.grpc?.port ?? 8001,
    metrics: http.metrics_port ?? 8002, management: config.management?.port ?? 8003,
  };
  const pod = deployment.spec.template.spec;
  const container = pod.containers.find((c) => c.name === "orochi");
  const containerPorts = Object.fromEntries(container.ports.map((p) => [p.name, p.containerPort]));
  for (const [name, port] of Object.entries(ports)) {
    if (containerPorts[name] !== port) {
      fail(where, `container port ${name} is ${containerPorts[name]}, the config says ${port}`);
    }
  }
  // Every address: the probes and the Service come from outside the pod.
  for (const address of [http.bind_address, config.grpc?.bind_address,
                         config.management?.bind_address]) {
    if (address !== "0.0.0.0") fail(where, `a listener is bound to ${address}, not 0.0.0.0`);
  }
  // Replicas share one repository volume: each must follow it, or an upload through one
  // replica would reach only that one.
  if (config.models?.model_control_mode !== "poll") {
    fail(where, "models.model_control_mode is not \"poll\": replicas would not follow the " +
                "shared repository");
  }
  if (config.management?.token_env !== "OROCHI_MANAGEMENT_TOKEN" ||
      !container.env?.some((e) => e.name === "OROCHI_MANAGEMENT_TOKEN" &&
                           e.valueFrom?.secretKeyRef?.name)) {
    fail(where, "the management token does not come from a Secret");
  }
  const probes = { startupProbe: "/v2/health/live", livenessProbe: "/v2/health/live",
                   readinessProbe: "/v2/health/ready" };
  for (const [probe, expected] of Object.entries(probes)) {
    const get = container[probe]?.httpGet;
    if (get?.path !== expected || containerPorts[get?.port] !== ports.http) {
      fail(where, `${probe} is not GET ${expected} on the inference port`);
    }
  }
  // SIGKILL must not come before the server's own end: delay + grace + its 5 s of slack.
  const needed = (http.shutdown_delay_s ?? 5) + (http.shutdown_grace_s ?? 30) + 5;
  if (!(pod.terminationGracePeriodSeconds > needed)) {
    fail(where, `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} is not ` +
                `more than shutdown_delay_s + shutdown_grace_s + 5 = ${needed}`);
  }
  if (!(http.shutdown_delay_s > 0)) fail(where, "no shutdown delay: rolling updates drop requests");
  const security = container.securityContext ?? {};
  if (pod.securityContext?.runAsNonRoot !== true || pod.securityContext?.runAsUser !== 10001 ||
      security.readOnlyRootFilesystem !== true || security.allowPrivilegeEscalation !== false ||
      JSON.stringify(security.capabilities?.drop) !== '["ALL"]' || security.capabilities?.add) {
    fail(where, "not non-root uid 10001 with a read-only root and no capabilities");
  }
  const mounts = Object.fromEntries(container.volumeMounts.map((m) => [m.mountPath, m.name]));
  const claim = pod.volumes.find((v) => v.name === mounts[config.models?.repository]);
  const pvc = claim && find("PersistentVolumeClaim", claim.persistentVolumeClaim?.claimName);
  if (!pvc?.spec.accessModes.includes("ReadWriteMany")) {
    fail(where, "the repository is not a ReadWriteMany claim mounted where the config says");
  }
  const configVolume = pod.volumes.find((v) => v.name === mounts["/etc/orochi"]);
  if (configVolume?.configMap?.name !== "orochi-config") {
    fail(where, "orochi-config is not mounted at /etc/orochi, where the image reads it");
  }
  const labels = deployment.spec.template.metadata.labels;
  const selects = (selector) => selector &&
    Object.entries(selector).every(([name, value]) => labels[name] === value);
  const service = find("Service", "orochi");
  const servicePorts = Object.fromEntries(service.spec.ports.map((p) => [p.name, p]));
  for (const name of ["http", "grpc", "metrics"]) {
    if (servicePorts[name]?.port !== ports[name]) {
      fail(where, `Service port ${name} is not ${ports[name]}`);
    }
  }
  if (servicePorts.grpc?.appProtocol !== "grpc") {
    fail(where, "the grpc port lacks appProtocol grpc");
  }
  if (servicePorts.management) fail(where, "the inference Service exposes the management port");
  const selectors = [
    ["Service", service.spec.selector],
    ["PodDisruptionBudget", find("PodDisruptionBudget", "orochi")?.spec.selector.matchLabels],
    ["PodMonitor", find("PodMonitor", "orochi")?.spec.selector.matchLabels],
    ["NetworkPolicy", find("NetworkPolicy", "orochi")?.spec.podSelector.matchLabels],
  ];
  for (const [kind, selector] of selectors) {
    if (!selects(selector)) fail(where, `the ${kind} does not select the Deployment's pods`);
  }
  const monitor = find("PodMonitor", "orochi");
  if (monitor?.spec.podMetricsEndpoints[0]?.port !== "metrics") fail(where, "PodMonitor port");
  // The management port only from this namespace: each rule that admits it has a podSelector
  // source (same namespace) and no namespaceSelector or ipBlock.
  const policy = find("NetworkPolicy", "orochi");
  for (const rule of policy.spec.ingress) {
    const admitsManagement = (rule.ports ?? []).some((p) => p.port === "management" ||
                                                     p.port === ports.management) || !rule.ports;
    if (admitsManagement && (!rule.from || rule.from.some((f) => !f.podSelector ||
                                                          f.namespaceSelector || f.ipBlock))) {
      fail(where, "the NetworkPolicy admits the management port from outside the namespace");
    }
  }
  const hpa = find("HorizontalPodAutoscaler", "orochi");
  if (hpa?.spec.scaleTargetRef.name !== "orochi") {
    fail(where, "the HPA does not scale the Deployment");
  }
}

// Objects in a comparable form: keys sorted at every level, objects sorted by kind and name.
function canonical(objects) {
  const sortKeys = (value) => Array.isArray(value) ? value.map(sortKeys)
    : value && typeof value === "object"
      ? Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortKeys(value[k])]))
      : value;
  return JSON.stringify(objects.map((o) => [key(o), sortKeys(o)])
    .sort((a, b) => a[0].localeCompare(b[0])));
}

// --- KServe and prometheus-adapter --------------------------------------------------------------

const containerFields = ["args", "command", "env", "envFrom", "image", "imagePullPolicy",
  "lifecycle", "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "resources",
  "restartPolicy", "restartPolicyRules", "securityContext", "startupProbe", "stdin", "stdinOnce",
  "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts",
  "workingDir"];

async function kubernetesValidator(type) {
  const module = type.startsWith("IoK8sApimachinery")
    ? `@kubernetes-models/apimachinery/_schemas/${type}` : `kubernetes-models/_schemas/${type}`;
  return (await import(module)).validate;
}

// An ajv whose kubernetesType keyword checks a value with the kubernetes-models validator of that
// type, and whose kubernetesContainer and kubernetesPodSpec keywords check the Container or
// PodSpec fields that KServe inlines into an object (a ModelSpec, a PredictorSpec).
async function kserveAjv(schema) {
  const types = new Set(JSON.stringify(schema).match(/IoK8s[A-Za-z0-9]+/g));
  types.add("IoK8sApiCoreV1Container");
  types.add("IoK8sApiCoreV1PodSpec");
  const validators = {};
  for (const type of types) validators[type] = await kubernetesValidator(type);
  // The errors of a kubernetes-models validator, at their place in the whole object.
  const check = (type, data, at) => {
    if (validators[type](data)) return [];
    return validators[type].errors.map((e) => ({ ...e, instancePath: at + e.instancePath,
      message: `${e.message ?? e.keyword} ${JSON.stringify(e.params)} (${type})` }));
  };
  const keyword = (name, pick) => {
    const validate = function (type, data, parentSchema, context) {
      validate.errors = check(typeof type === "string" ? type : pick.type, pick.data(data),
                              context?.instancePath ?? "");
      return validate.errors.length === 0;
    };
    return { keyword: name, errors: true, validate };
  };
  const ajv = new Ajv({ allErrors: true, strict: true });
  ajv.addKeyword(keyword("kubernetesType", { data: (d) => d }));
  const picked = (d, fields) => Object.fromEntries(
    Object.entries(d).filter(([field]) => fields.includes(field)));
  ajv.addKeyword(keyword("kubernetesContainer", { type: "IoK8sApiCoreV1Container",
    data: (d) => ({ name: "kserve-container", ...picked(d, containerFields) }) }));
  const podFields = schema.definitions.predictorFieldNames.enum.slice(
    schema.definitions.predictorFieldNames.enum.indexOf("activeDeadlineSeconds"));
  ajv.addKeyword(keyword("kubernetesPodSpec", { type: "IoK8sApiCoreV1PodSpec",
    data: (d) => ({ containers: [], ...picked(d, podFields) }) }));
  ajv.addSchema(schema, "kserve");
  return ajv;
}

function ajvErrors(validate) {
  // A field that propertyNames refuses also fails its enum: one message for it is enough.
  return validate.errors.filter((e) => e.keyword !== "enum" || !e.propertyName).map((e) => {
    const field = e.params?.propertyName ?? e.params?.additionalProperty;
    return `${e.instancePath || "/"}${field ? ` field ${field}:` : ""} ${e.message}`;
  }).join("; ");
}

// `--flag=value` arguments as a map.
const flags = (args) => Object.fromEntries((args ?? []).filter((a) => a.startsWith("--"))
  .map((a) => [a.slice(0, a.indexOf("=") < 0 ? undefined : a.indexOf("=")),
               a.includes("=") ? a.slice(a.indexOf("=") + 1) : true]));

function checkKServe(where, objects) {
  const runtimes = objects.filter((o) => o.kind === "ClusterServingRuntime");
  const services = objects.filter((o) => o.kind === "InferenceService");
  if (runtimes.length !== 1 || services.length === 0) {
    return fail(where, "expected one ClusterServingRuntime and InferenceService examples");
  }
  const runtime = runtimes[0];
  const spec = runtime.spec;
  if (!spec.supportedModelFormats?.some((f) => f.name === "orochi")) {
    fail(where, "the runtime does not support model format orochi");
  }
  const known = ["v1", "v2", "grpc-v1", "grpc-v2"];
  for (const protocol of spec.protocolVersions ?? []) {
    if (!known.includes(protocol)) fail(where, `unknown protocol version ${protocol}`);
  }
  if (!["v2", "grpc-v2"].every((p) => spec.protocolVersions?.includes(p))) {
    fail(where, "the runtime does not offer v2 and grpc-v2, which the server serves");
  }
  const container = spec.containers.find((c) => c.name === "kserve-container");
  if (!container) return fail(where, "the runtime has no kserve-container");
  const args = flags(container.args);
  if (JSON.stringify(container.command) !== '["orochi","serve"]') {
    fail(where, "the runtime does not run `orochi serve`");
  }
  if (args["--model-dir"] !== "/mnt/models" || args["--model-name"] !== "{{.Name}}") {
    fail(where, "the runtime does not pass --model-dir=/mnt/models --model-name={{.Name}}");
  }
  if (args["--bind"] !== "0.0.0.0") fail(where, "the runtime's listeners are not on 0.0.0.0");
  const port = (flag, fallback) => Number(args[flag] ?? fallback);
  const http = port("--http-port", 8000);
  const grpc = port("--grpc-port", 8001);
  const metrics = port("--metrics-port", 8002);
  const http1 = container.ports?.find((p) => p.name === "http1");
  if (container.ports?.length !== 1 || http1?.containerPort !== http) {
    fail(where, `the runtime's one port must be http1 ${http}, the inference port (Knative ` +
                "routes to a single port)");
  }
  if (Number(spec.annotations?.["prometheus.kserve.io/port"]) !== metrics ||
      spec.annotations?.["prometheus.kserve.io/path"] !== "/metrics") {
    fail(where, `prometheus.kserve.io/port and path are not the metrics port ${metrics} /metrics`);
  }
  for (const [probe, path] of [["readinessProbe", "/v2/health/ready"],
                               ["livenessProbe", "/v2/health/live"]]) {
    const get = container[probe]?.httpGet;
    if (get?.path !== path || get?.port !== http) fail(where, `${probe} is not GET ${path}`);
  }
  const security = container.securityContext ?? {};
  if (security.runAsNonRoot !== true || security.readOnlyRootFilesystem !== true ||
      security.allowPrivilegeEscalation !== false ||
      JSON.stringify(security.capabilities?.drop) !== '["ALL"]') {
    fail(where, "the runtime's container is not non-root, read-only, without capabilities");
  }
  const tmp = container.volumeMounts?.find((m) => m.mountPath === "/tmp");
  if (!spec.volumes?.some((v) => v.name === tmp?.name && v.emptyDir)) {
    fail(where, "no emptyDir at /tmp, where the server keeps its scratch repository");
  }
  for (const service of services) {
    const here = `${where} InferenceService/${service.metadata.name}`;
    const model = service.spec.predictor.model;
    if (model?.modelFormat?.name !== "orochi" || model.runtime !== runtime.metadata.name) {
      fail(here, `not model format orochi on runtime ${runtime.metadata.name}`);
    }
    if (!model?.storageUri) fail(here, "no storageUri");
    if (model?.protocolVersion && !spec.protocolVersions.includes(model.protocolVersion)) {
      fail(here, `protocol ${model.protocolVersion} is not one the runtime offers`);
    }
    if (model?.protocolVersion === "grpc-v2" &&
        !(model.ports?.length === 1 && model.ports[0].name === "h2c" &&
          model.ports[0].containerPort === grpc)) {
      fail(here, `grpc-v2 needs the one port h2c ${grpc}, the gRPC port`);
    }
    // The server's default shutdown delay (5) and grace (30) and its 5 s of slack.
    const grace = service.spec.predictor.terminationGracePeriodSeconds;
    if (!(grace > 40)) fail(here, `terminationGracePeriodSeconds ${grace} is not more than 40`);
  }
}

// The metric name a series query selects: `name{...}`.
const seriesName = (query) => /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(query)?.[1];

// The rule's queries as the adapter sends them to Prometheus (its templates filled in as for an
// HPA asking for two pods), parsed by promtool where it is installed.
function checkPromQL(where, name, rule) {
  const query = rule.metricsQuery.replaceAll("<<.Series>>", seriesName(rule.seriesQuery))
    .replaceAll("<<.LabelMatchers>>", 'namespace="default",pod=~"orochi-a|orochi-b"')
    .replaceAll("<<.GroupBy>>", "pod");
  const directory = fs.mkdtempSync(path.join(os.tmpdir(), "orochi-adapter-"));
  const rules = path.join(directory, "rules.yml");
  fs.writeFileSync(rules, YAML.stringify({ groups: [{ name: "adapter", rules: [
    { record: "adapter:series", expr: rule.seriesQuery },
    { record: `adapter:${name}`, expr: query }] }] }));
  try {
    execFileSync("promtool", ["check", "rules", rules], { stdio: ["ignore", "pipe", "pipe"] });
  } catch (error) {
    if (error.code !== "ENOENT") {
      const said = `${error.stdout}${error.stderr}`.replace(/\s+/g, " ").trim();
      fail(where, `${name}: promtool refuses the queries: ${said}`);
    }
  } finally {
    fs.rmSync(directory, { recursive: true });
  }
}

function checkAdapter(where, values, overlays, metricsDoc) {
  const published = new Map();
  for (const rule of values.rules.custom) {
    const series = seriesName(rule.seriesQuery);
    if (!series || !new RegExp(`\\| \`${series}\` \\|`).test(metricsDoc)) {
      fail(where, `${rule.seriesQuery}: not a metric of docs/METRICS.md`);
    }
    const name = rule.name?.as ?? series;
    if (rule.name?.matches && !new RegExp(rule.name.matches).test(series)) {
      fail(where, `name.matches ${rule.name.matches} does not match ${series}`);
    }
    // The PodMonitor's scrape labels every series with its namespace and pod.
    const overrides = rule.resources?.overrides ?? {};
    if (overrides.namespace?.resource !== "namespace" || overrides.pod?.resource !== "pod") {
      fail(where, `${name}: not published per pod (namespace and pod label overrides)`);
    }
    for (const template of ["<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"]) {
      if (!rule.metricsQuery.includes(template)) {
        fail(where, `${name}: metricsQuery lacks ${template}, so it is not per pod`);
      }
    }
    checkPromQL(where, name, rule);
    published.set(name, rule);
  }
  for (const [overlay, objects] of overlays) {
    const hpa = objects.find((o) => o.kind === "HorizontalPodAutoscaler");
    const custom = (hpa?.spec.metrics ?? []).filter((m) => m.type === "Pods");
    if (custom.length === 0) fail(overlay, "the HPA has no per-pod custom metric");
    for (const metric of custom) {
      if (!published.has(metric.pods.metric.name)) {
        fail(overlay, `the HPA asks for ${metric.pods.metric.name}, which no adapter rule ` +
                      "publishes");
      }
    }
  }
}

// --- main --------------------------------------------------------------------------------------

const overlays = fs.readdirSync(path.join(root, "overlays"));
const rendered = new Map();
for (const overlay of overlays) {
  const directory = path.join(root, "overlays", overlay);
  const where = `overlays/${overlay}`;
  let objects;
  try {
    objects = render(directory);
  } catch (error) {
    fail(where, error.message);
    continue;
  }
  rendered.set(where, objects);
  await validateSchemas(where, objects);
  checkInvariants(where, objects);
  let kubectl = "";
  // OROCHI_NO_KUBECTL: the self-test's broken copies, whose rendering is not what they test.
  if (!process.env.OROCHI_NO_KUBECTL) {
    try {
      kubectl = execFileSync("kubectl", ["kustomize", directory],
                             { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (error) {
      if (error.code !== "ENOENT") {
        fail(where, `kubectl kustomize: ${error.stderr || error.message}`);
      }
    }
  }
  let compared = "";
  if (kubectl) {
    const theirs = canonical(YAML.parseAllDocuments(kubectl).map((d) => d.toJS()));
    if (theirs !== canonical(objects)) {
      fail(where, "our rendering differs from kubectl kustomize's");
    } else {
      compared = ", the same as kubectl kustomize renders";
    }
  }
  console.log(`${where}: ${objects.length} objects (${objects.map(key).join(", ")})${compared}`);
}
if (overlays.length === 0) fail("overlays", "none");

const kserveSchema = JSON.parse(
  fs.readFileSync(path.join(here, "kserve-crds.schema.json"), "utf8"));
const kserve = await kserveAjv(kserveSchema);
const kserveObjects = fs.readdirSync(path.join(root, "kserve")).filter((f) => f.endsWith(".yaml"))
  .flatMap((file) => readDocuments(path.join(root, "kserve", file)));
for (const object of kserveObjects) {
  const validate = kserve.getSchema(`kserve#/definitions/${object.kind}`);
  if (!validate) fail(`kserve ${key(object)}`, "not a kind of the KServe schema");
  else if (!validate(object)) fail(`kserve ${key(object)}`, ajvErrors(validate));
}
checkKServe("kserve", kserveObjects);
console.log(`kserve: ${kserveObjects.length} objects (${kserveObjects.map(key).join(", ")})`);

const adapterSchema = JSON.parse(
  fs.readFileSync(path.join(here, "prometheus-adapter-rules.schema.json"), "utf8"));
const adapterValues = readDocuments(path.join(root, "prometheus-adapter", "values.yaml"))[0];
const validateAdapter = new Ajv({ allErrors: true, strict: true }).compile(adapterSchema);
if (!validateAdapter(adapterValues)) {
  fail("prometheus-adapter", ajvErrors(validateAdapter));
} else {
  const metricsDoc = fs.readFileSync(
    process.env.OROCHI_METRICS_DOC ?? path.join(root, "..", "..", "docs", "METRICS.md"), "utf8");
  checkAdapter("prometheus-adapter", adapterValues, rendered, metricsDoc);
}
console.log(`prometheus-adapter: ${adapterValues.rules.custom.length} rules ` +
            `(${adapterValues.rules.custom.map((r) => r.name?.as).join(", ")})`);

for (const failure of failures) console.log(`FAIL ${failure}`);
const checked = overlays.length + 2;
const failed = new Set(failures.map((f) => f.split(/[ :]/)[0])).size;
console.log(`${checked - failed} passed, ${failed} failed`);
process.exit(failures.length > 0 ? 1 : 0);
