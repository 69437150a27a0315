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

import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
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

// --- main --------------------------------------------------------------------------------------

const overlays = fs.readdirSync(path.join(root, "overlays"));
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
  await validateSchemas(where, objects);
  checkInvariants(where, objects);
  let kubectl = "";
  try {
    kubectl = execFileSync("kubectl", ["kustomize", directory],
                           { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  } catch (error) {
    if (error.code !== "ENOENT") fail(where, `kubectl kustomize: ${error.stderr || error.message}`);
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
for (const failure of failures) console.log(`FAIL ${failure}`);
const failed = new Set(failures.map((f) => f.split(/[ :]/)[0])).size;
console.log(`${overlays.length - failed} passed, ${failed} failed`);
process.exit(failures.length > 0 ? 1 : 0);
