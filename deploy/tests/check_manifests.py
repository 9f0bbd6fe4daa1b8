#!/usr/bin/python3
"""Checks the manifests rendered from the Conveyor chart against what the chart promises.

    check_manifests.py MANIFESTS.yaml --chart deploy/helm/conveyor [-f VALUES]... --namespace NS
                       [--lookup CLUSTER_OBJECTS.yaml]

The expectations come from the same values the manifests were rendered with (the chart's
values.yaml coalesced with each -f file), so one checker serves every values file:
objects and kinds, ports, gRPC probes, GPUs per worker, StatefulSet replicas = TP size,
the scheduler's --workers list against the StatefulSet and headless Service names, the
NetworkPolicies against the pods' labels, termination grace against the drain timeout,
the liveness probe against the worker recovery timeout, the ServiceMonitor against the
Services, and the scheduler's identity: a Secret (the chart's, or existingSecret) read
into the env and from there into --scheduler_id. With TLS or tokens on (tls.*, auth.*):
the flags on the right container, each file flag pointing into a read-only mount of the
right Secret and key (mode 0440 at most), the probes on the plaintext health port, and
the workers' --collective_host = their stable DNS name, which their certificate names. With --lookup (the objects the render's
`lookup` saw, as on `helm upgrade`), the chart's Secret must keep the id found there.
Prints every failed check; exit status 1 if any.
"""

import argparse
import base64
import binascii
import re
import sys
import types

import yaml

from check_dockerfiles import ROUTER_PINS

SCHEDULER_FLAGS = ["host", "port", "metrics_port", "model", "workers", "policy", "max_num_seqs",
                   "max_step_tokens", "block_size", "kv_cache_bytes", "max_queue", "batch_size",
                   "batch_timeout_ms", "batch_window_ms", "drain_timeout_s", "step_timeout_s",
                   "max_steps_in_flight", "worker_recovery_timeout_s", "scheduler_id",
                   "log_level", "enable_reflection"]
WORKER_FLAGS = ["host", "port", "metrics_port", "backend", "threads", "binding_lease_s",
                "rendezvous_timeout_s", "log_level", "collective_host"]
INT_FLAGS = {"port", "metrics_port", "max_num_seqs", "max_step_tokens", "block_size",
             "kv_cache_bytes", "max_queue", "batch_size", "batch_timeout_ms", "batch_window_ms",
             "drain_timeout_s", "step_timeout_s", "max_steps_in_flight",
             "worker_recovery_timeout_s", "threads",
             "binding_lease_s", "rendezvous_timeout_s", "health_port", "tls_refresh_s",
             "max_concurrent_requests_per_token"}
# Secret files: readable by the owner (root) and the pod's fsGroup at most, never written.
MAX_SECRET_MODE = 0o440
# The scheduler's identity reaches --scheduler_id through this variable (Kubernetes
# expands $(VAR) in args), so that the id itself never appears in the pod spec.
ID_ENV = "CONVEYOR_SCHEDULER_ID"
ID_LENGTH = 32  # randAlphaNum 32
# An idle scheduler renews its binding with a Health check this often (scheduler/engine.h).
IDLE_CHECK_S = 2
# The label that tells model replicas (scheduler + worker groups) apart, with several.
GROUP_LABEL = "conveyor.ai/replica-group"
# The routers: what comes before their flags, and the policies each one's --help lists
# (vllm-router's kv_aware needs KV events Conveyor does not publish).
ROUTER_SUBCOMMAND = {"vllm-router": [], "sglang-router": ["launch"]}
ROUTER_POLICIES = {
    "vllm-router": ["cache_aware", "round_robin", "power_of_two", "random", "consistent_hash",
                    "sticky_least_loaded"],
    "sglang-router": ["cache_aware", "round_robin", "power_of_two", "random", "manual"],
}
# RBAC, as (apiGroups, resources, verbs): service discovery reads pods; the endpoint picker
# also watches its InferencePool and the objectives / rewrites that refer to it.
READ = ("get", "list", "watch")
ROUTER_RULES = [(("",), ("pods",), READ)]
EPP_RULES = [(("",), ("pods",), READ), (("inference.networking.k8s.io",), ("inferencepools",), READ),
             (("inference.networking.x-k8s.io",), ("inferencemodelrewrites", "inferenceobjectives"), READ)]
# The endpoint picker's metric flags for Conveyor (docs/scaling.md); LoRA off.
EPP_METRIC_FLAGS = {
    "total-queued-requests-metric": "conveyor_requests_waiting",
    "total-running-requests-metric": "conveyor_requests_running",
    "kv-cache-usage-percentage-metric": "conveyor_kv_cache_usage_ratio",
    "cache-info-metric": "conveyor_cache_config_info",
    "lora-info-metric": "",
}
EPP_METRICS_PORT = 9090
RECOMMENDED_LABELS = ["app.kubernetes.io/name", "app.kubernetes.io/instance",
                      "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                      "helm.sh/chart"]


def coalesce(src, dst):
    out = dict(dst)
    for key, value in src.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(value, out[key])
        else:
            out[key] = value
    return out


class Checker:
    def __init__(self):
        self.failures = []
        self.count = 0

    def expect(self, condition, message):
        self.count += 1
        if not condition:
            self.failures.append(message)
        return bool(condition)


def subset(selector, labels):
    """True if every key of the selector is in labels with the same value."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def parse_args(container):
    """--name=value arguments -> {name: [values]}."""
    flags = {}
    for arg in container.get("args", []):
        name, _, value = str(arg).lstrip("-").partition("=")
        flags.setdefault(name, []).append(value)
    return flags


def resource_names(container):
    res = container.get("resources") or {}
    return {name: value for part in ("requests", "limits")
            for name, value in ((res.get(part) or {}).items())}


def check_probes(container, grpc_port, who, check):
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container.get(probe) or {}
        check.expect(spec.get("grpc", {}).get("port") == grpc_port,
                     f"{who}: {probe} must be a native gRPC probe on port {grpc_port}, got {spec}")
        check.expect(not any(k in spec for k in ("httpGet", "tcpSocket", "exec")),
                     f"{who}: {probe} has a second handler")


def secret_file(pod, container, path):
    """(Secret name, key, mode) of the file at `path`, if a read-only Secret volume
    mount provides it; else a string saying why not."""
    directory, _, filename = str(path).rpartition("/")
    mounts = [m for m in container.get("volumeMounts", []) if m.get("mountPath") == directory]
    if len(mounts) != 1:
        return f"no (single) volume mounted at {directory}"
    mount = mounts[0]
    if mount.get("readOnly") is not True or mount.get("subPath"):
        return f"the mount at {directory} is not read-only or uses subPath (no in-place updates)"
    volume = next((v for v in pod["spec"].get("volumes", []) if v["name"] == mount["name"]), {})
    secret = volume.get("secret")
    if not secret:
        return f"volume {mount['name']} is not a Secret volume: {volume}"
    items = secret.get("items")
    if items is None:
        key = filename
    else:
        keys = [i["key"] for i in items if i.get("path") == filename]
        if len(keys) != 1:
            return f"Secret volume {mount['name']} has no item for {filename}: {items}"
        key = keys[0]
    modes = [secret.get("defaultMode", 0o644)] + [i["mode"] for i in items or [] if "mode" in i]
    return secret.get("secretName"), key, max(modes, key=lambda m: m & ~MAX_SECRET_MODE)


def check_secret_file(pod, container, flags, flag, secret, key, who, check):
    """--flag names a file that is `key` of Secret `secret`, mounted read-only, mode <= 0440."""
    path = flags.get(flag)
    found = secret_file(pod, container, path) if path else "flag missing"
    if isinstance(found, str):
        check.expect(False, f"{who}: --{flag}={path} is not a file of Secret {secret}/{key}: {found}")
        return
    name, got_key, mode = found
    check.expect((name, got_key) == (secret, key),
                 f"{who}: --{flag}={path} is not a file of Secret {secret}/{key}: it is {name}/{got_key}")
    check.expect(isinstance(mode, int) and mode & ~MAX_SECRET_MODE == 0,
                 f"{who}: Secret volume for --{flag} has defaultMode {oct(mode) if isinstance(mode, int) else mode}, "
                 f"more than {oct(MAX_SECRET_MODE)}")


def container_ports(container):
    return {p.get("name"): p.get("containerPort") for p in container.get("ports", [])}


def check_int_flags(flags, who, check):
    for name in INT_FLAGS & set(flags):
        value = flags[name][0]
        check.expect(value.lstrip("-").isdigit(), f"{who}: --{name}={value} is not an integer")


def peers_allowed_on(policy, port):
    """Ingress peers allowed to reach `port`; None stands for 'any source'."""
    peers = []
    for rule in policy["spec"].get("ingress") or []:
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port or
                             (p.get("endPort") and p["port"] <= port <= p["endPort"])
                             for p in ports):
            continue
        if not rule.get("from"):
            peers.append(None)
        else:
            peers.extend(rule["from"])
    return peers


def component(obj):
    return ((obj.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component")


def pod_labels(workload):
    return workload["spec"]["template"]["metadata"].get("labels") or {}


def group_of(obj):
    """The group label of a workload's pods (or of an object), None without one."""
    labels = pod_labels(obj) if obj.get("kind") in ("Deployment", "StatefulSet") else \
        ((obj.get("metadata") or {}).get("labels") or {})
    return labels.get(GROUP_LABEL)


def find_groups(objs, n, check):
    """[(scheduler Deployment, worker StatefulSet, headless Service)] in group order, or None.
    With one group nothing carries the group label (names and selectors as before groups
    existed); with several, each group's objects carry its index and select only it."""
    deploys = [o for o in objs if o.get("kind") == "Deployment" and component(o) == "scheduler"]
    stss = [o for o in objs if o.get("kind") == "StatefulSet"]
    headless = [o for o in objs if o.get("kind") == "Service" and o["spec"].get("clusterIP") == "None"]
    check.expect(len(deploys) == n, f"expected {n} scheduler Deployments (replicas), found {len(deploys)}")
    check.expect(len(stss) == n, f"expected {n} worker StatefulSets (replicas), found {len(stss)}")
    check.expect(len(headless) == n, f"expected {n} headless Services (clusterIP: None), one per group, "
                 f"found {len(headless)}")
    if not (len(deploys) == len(stss) == len(headless) == n):
        return None
    if n == 1:
        for o in deploys + stss + headless:
            labels = dict((o["metadata"].get("labels") or {}), **(
                pod_labels(o) if o["kind"] != "Service" else o["spec"].get("selector") or {}))
            check.expect(GROUP_LABEL not in labels,
                         f"{o['kind']} {o['metadata']['name']}: one replica carries no {GROUP_LABEL} "
                         "label (its names and selectors stay as they were)")
        return [(deploys[0], stss[0], headless[0])]
    groups = []
    for i in range(n):
        want = str(i)
        d = [o for o in deploys if group_of(o) == want and
             o["spec"]["selector"]["matchLabels"].get(GROUP_LABEL) == want]
        t = [o for o in stss if group_of(o) == want and
             o["spec"]["selector"]["matchLabels"].get(GROUP_LABEL) == want]
        h = [o for o in headless if (o["spec"].get("selector") or {}).get(GROUP_LABEL) == want]
        check.expect(len(d) == 1 and len(t) == 1 and len(h) == 1,
                     f"group {i}: expected one scheduler Deployment, worker StatefulSet and headless "
                     f"Service whose pods and selectors carry {GROUP_LABEL}: \"{i}\", found "
                     f"{len(d)}, {len(t)}, {len(h)}")
        if not (len(d) == 1 and len(t) == 1 and len(h) == 1):
            return None
        groups.append((d[0], t[0], h[0]))
    return groups


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifests")
    parser.add_argument("--chart", required=True)
    parser.add_argument("-f", dest="values", action="append", default=[])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--lookup", help="cluster objects the render's lookup found")
    args = parser.parse_args()

    with open(f"{args.chart}/values.yaml", encoding="utf-8") as f:
        values = yaml.safe_load(f)
    for path in args.values:
        with open(path, encoding="utf-8") as f:
            values = coalesce(yaml.safe_load(f) or {}, values)
    with open(args.manifests, encoding="utf-8") as f:
        objs = [d for d in yaml.safe_load_all(f) if d]

    check = Checker()
    # The ports are part of Conveyor's contract (clients, probes, dashboards, docs).
    with open(f"{args.chart}/values.yaml", encoding="utf-8") as f:
        defaults = yaml.safe_load(f)
    default_ports = [defaults["scheduler"]["grpcPort"], defaults["scheduler"]["metricsPort"],
                     defaults["worker"]["grpcPort"], defaults["worker"]["metricsPort"]]
    check.expect(default_ports == [50051, 9400, 50061, 9401],
                 f"chart default ports {default_ports} != [50051, 9400, 50061, 9401]")
    c = expectations(values, args)

    # --- Every object: identity and recommended labels.
    seen = set()
    for o in objs:
        meta = o.get("metadata") or {}
        key = (o.get("kind"), meta.get("name"))
        check.expect(o.get("apiVersion") and all(key), f"object without apiVersion/kind/name: {key}")
        check.expect(key not in seen, f"duplicate object {key}")
        seen.add(key)
        labels = meta.get("labels") or {}
        missing = [label for label in RECOMMENDED_LABELS if label not in labels]
        check.expect(not missing, f"{key}: missing labels {missing}")
        check.expect(len(meta.get("name", "")) <= 63, f"{key}: name longer than 63 characters")

    groups = find_groups(objs, c.n, check)
    services = [o for o in objs if o.get("kind") == "Service"]
    expected_services = c.n + 1 + bool(c.router) + bool(c.pool)
    check.expect(len(services) == expected_services,
                 f"expected {expected_services} Services (a headless one per group, the scheduler's"
                 f"{', the router' if c.router else ''}{', the endpoint picker' if c.pool else ''}), "
                 f"found {len(services)}")
    clients = [s for s in services if component(s) == "scheduler" and s["spec"].get("clusterIP") != "None"]
    check.expect(len(clients) == 1, "expected exactly one (non-headless) scheduler Service")
    if not groups or len(clients) != 1:
        return report(check)
    c.sched_pods = [pod_labels(d) for d, _, _ in groups]
    c.worker_pods = [pod_labels(t) for _, t, _ in groups]
    c.other_pods = {component(o): pod_labels(o) for o in objs
                    if o.get("kind") == "Deployment" and component(o) != "scheduler"}

    for i, group in enumerate(groups):
        check_group(i, group, objs, c, args, check)
    check_groups_apart(groups, objs, c, check)
    check_client_service(clients[0], c, check)
    check_service_monitor(objs, services, c, args, check)
    check_network_policies(objs, groups, c, check)
    check_router(objs, c, args, check)
    check_inference_pool(objs, c, args, check)
    check_rbac(objs, c, args, check)

    # --- Service accounts: Conveyor's pods never call the Kubernetes API.
    for i, (deploy, sts, _) in enumerate(groups):
        for who, pod in (("scheduler", deploy["spec"]["template"]), ("worker", sts["spec"]["template"])):
            name = pod["spec"].get("serviceAccountName")
            if values["serviceAccount"]["create"]:
                check.expect(("ServiceAccount", name) in seen, f"{who}: ServiceAccount {name} not rendered")
            check.expect(pod["spec"].get("automountServiceAccountToken") is False,
                         f"{who}: the API token should not be mounted")

    return report(check)


def expectations(values, args):
    """What the values call for, shared by every check."""
    c = types.SimpleNamespace(values=values, namespace=args.namespace)
    c.n = values["replicas"]
    c.tp = values["tensorParallelSize"]
    c.cpu = values["cpuOnly"]["enabled"]
    c.sched_v, c.worker_v = values["scheduler"], values["worker"]
    c.client_tls, c.internal_tls = values["tls"]["clientApi"], values["tls"]["internal"]
    c.auth = values["auth"]
    c.s_health = c.sched_v["healthPort"] if c.client_tls["enabled"] else None
    c.s_http = c.sched_v["httpPort"] or None
    c.w_health = c.worker_v["healthPort"] if c.internal_tls["enabled"] else None
    c.sched_flags = list(SCHEDULER_FLAGS)
    if c.client_tls["enabled"]:
        c.sched_flags += ["tls_cert_file", "tls_key_file", "health_port"]
        if c.client_tls["requireClientCert"]:
            c.sched_flags.append("tls_client_ca_file")
    if c.internal_tls["enabled"]:
        c.sched_flags += ["worker_tls_cert_file", "worker_tls_key_file", "worker_tls_ca_file"]
    if c.client_tls["enabled"] or c.internal_tls["enabled"]:
        c.sched_flags.append("tls_refresh_s")
    if c.auth["tokensSecretName"]:
        c.sched_flags += ["auth_tokens_file", "max_concurrent_requests_per_token"]
    if c.s_http:
        c.sched_flags.append("http_port")
    if values["model"].get("servedName"):
        c.sched_flags.append("served_model_name")
    c.worker_flags = list(WORKER_FLAGS)
    if c.internal_tls["enabled"]:
        c.worker_flags += ["tls_cert_file", "tls_key_file", "tls_ca_file", "tls_refresh_s",
                           "health_port"]
    c.gpu_name = c.worker_v["gpuResourceName"]
    c.s_grpc, c.s_metrics = c.sched_v["grpcPort"], c.sched_v["metricsPort"]
    c.w_grpc, c.w_metrics = c.worker_v["grpcPort"], c.worker_v["metricsPort"]
    c.router = values["router"] if values["router"]["enabled"] else None
    c.pool = values["inferencePool"] if values["inferencePool"]["enabled"] else None
    c.monitoring = values["networkPolicy"]["monitoring"]["namespaceSelector"]
    return c


def check_group(i, group, objs, c, args, check):
    """One scheduler + worker group: the checks a single replica always had."""
    deploy, sts, headless = group
    values, sched_v, worker_v, cpu, tp = c.values, c.sched_v, c.worker_v, c.cpu, c.tp
    s_grpc, s_metrics, s_http, s_health = c.s_grpc, c.s_metrics, c.s_http, c.s_health
    w_grpc, w_metrics, w_health = c.w_grpc, c.w_metrics, c.w_health
    sched_pod = deploy["spec"]["template"]
    worker_pod = sts["spec"]["template"]
    sched_labels = sched_pod["metadata"]["labels"]
    worker_labels = worker_pod["metadata"]["labels"]
    g = f"group {i}: " if c.n > 1 else ""
    check.expect(subset(deploy["spec"]["selector"]["matchLabels"], sched_labels),
                 "Deployment selector does not match its pod template labels")
    check.expect(subset(sts["spec"]["selector"]["matchLabels"], worker_labels),
                 "StatefulSet selector does not match its pod template labels")
    check.expect(not subset(deploy["spec"]["selector"]["matchLabels"], worker_labels),
                 "the scheduler's selector also selects worker pods")
    check.expect(not subset(sts["spec"]["selector"]["matchLabels"], sched_labels),
                 "the workers' selector also selects scheduler pods")

    # --- Scheduler.
    check.expect(deploy["spec"].get("replicas") == 1, "scheduler replicas must be 1")
    check.expect(deploy["spec"].get("strategy", {}).get("type") == "Recreate",
                 "scheduler must use the Recreate strategy (one scheduler per worker group)")
    containers = sched_pod["spec"]["containers"]
    check.expect(len(containers) == 1, "scheduler pod must have one container")
    sc = containers[0]
    flags = parse_args(sc)
    check.expect(sorted(flags) == sorted(c.sched_flags),
                 f"scheduler flags {sorted(flags)} != {sorted(c.sched_flags)}")
    check.expect(all(len(v) == 1 for v in flags.values()), "a scheduler flag is repeated")
    check_int_flags(flags, "scheduler", check)
    first = {k: v[0] for k, v in flags.items()}
    check.expect(first.get("host") == "0.0.0.0", "scheduler --host must be 0.0.0.0")
    check.expect(first.get("port") == str(s_grpc),
                 f"scheduler --port={first.get('port')}, expected {s_grpc}")
    check.expect(first.get("metrics_port") == str(s_metrics),
                 f"scheduler --metrics_port={first.get('metrics_port')}, expected {s_metrics}")
    check.expect(first.get("model") == values["model"]["path"], "scheduler --model != model.path")
    check.expect(first.get("served_model_name", "") == (values["model"].get("servedName") or ""),
                 "scheduler --served_model_name != model.servedName")
    check.expect(first.get("policy") in ("static", "dynamic", "continuous")
                 and first.get("policy") == sched_v["policy"], "scheduler --policy")
    for flag, key in (("max_num_seqs", "maxNumSeqs"), ("max_step_tokens", "maxStepTokens"),
                      ("block_size", "blockSize"), ("max_queue", "maxQueue"),
                      ("batch_size", "batchSize"), ("batch_timeout_ms", "batchTimeoutMs"),
                      ("batch_window_ms", "batchWindowMs"), ("drain_timeout_s", "drainTimeoutS"),
                      ("step_timeout_s", "stepTimeoutS"),
                      ("max_steps_in_flight", "maxStepsInFlight"),
                      ("worker_recovery_timeout_s", "workerRecoveryTimeoutS"),
                      ("log_level", "logLevel")):
        check.expect(first.get(flag) == str(sched_v[key]),
                     f"scheduler --{flag}={first.get(flag)} != scheduler.{key}={sched_v[key]}")
    expected_kv = sched_v["kvCacheBytes"] or (values["cpuOnly"]["kvCacheBytes"] if cpu else 0)
    check.expect(first.get("kv_cache_bytes") == str(expected_kv),
                 f"scheduler --kv_cache_bytes={first.get('kv_cache_bytes')}, expected {expected_kv}")
    check.expect(first.get("http_port") == (str(s_http) if s_http else None),
                 f"scheduler --http_port={first.get('http_port')}, expected {s_http}")
    expected_ports = {"grpc": s_grpc, "metrics": s_metrics}
    if s_http:
        expected_ports["http"] = s_http
    if s_health:
        expected_ports["health"] = s_health
    check.expect(container_ports(sc) == expected_ports,
                 f"scheduler container ports {container_ports(sc)}, expected {expected_ports}")
    # TLS on the client port: the kubelet (no TLS) probes the plaintext health-only port.
    check_probes(sc, s_health or s_grpc, "scheduler", check)
    check.expect(first.get("enable_reflection") == str(bool(sched_v["enableReflection"])).lower(),
                 f"scheduler --enable_reflection={first.get('enable_reflection')} != "
                 f"scheduler.enableReflection={sched_v['enableReflection']}")
    check_scheduler_security(sched_pod, sc, first, values, s_health, check)
    check.expect(c.gpu_name not in resource_names(sc), "the scheduler must not request a GPU")
    grace = sched_pod["spec"].get("terminationGracePeriodSeconds")
    drain = int(first.get("drain_timeout_s", "0"))
    check.expect(isinstance(grace, int) and grace > drain,
                 f"scheduler terminationGracePeriodSeconds={grace} must exceed the drain timeout {drain}")
    # The scheduler is NOT_SERVING while it recovers its workers: liveness must outlast that.
    liveness = sc.get("livenessProbe") or {}
    liveness_s = liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)
    recovery = first.get("worker_recovery_timeout_s", "")
    check.expect(recovery.isdigit() and liveness_s > int(recovery),
                 f"scheduler liveness probe fails after {liveness_s} s, within "
                 f"--worker_recovery_timeout_s={recovery}: it would restart the scheduler mid-recovery")

    check_identity(i, objs, deploy, sc, first, c, args, check)

    # --- Workers: the --workers list, StatefulSet and headless Service agree.
    sts_name, svc_name = sts["metadata"]["name"], headless["metadata"]["name"]
    check.expect(sts["spec"].get("serviceName") == svc_name,
                 f"StatefulSet serviceName {sts['spec'].get('serviceName')} "
                 f"!= headless Service {svc_name}")
    check.expect(sts["spec"].get("replicas") == tp,
                 f"StatefulSet replicas {sts['spec'].get('replicas')} != TP {tp}")
    check.expect(sts["spec"].get("podManagementPolicy") == "Parallel",
                 "StatefulSet podManagementPolicy must be Parallel")
    workers = first.get("workers", "").split(",")
    expected = [f"{sts_name}-{rank}.{svc_name}.{args.namespace}.svc.{values['clusterDomain']}:{w_grpc}"
                for rank in range(tp)]
    check.expect(workers == expected, f"--workers={workers}, expected {expected}")

    containers = worker_pod["spec"]["containers"]
    check.expect(len(containers) == 1, "worker pod must have one container")
    wc = containers[0]
    wflags = parse_args(wc)
    check.expect(sorted(wflags) == sorted(c.worker_flags),
                 f"worker flags {sorted(wflags)} != {sorted(c.worker_flags)}")
    check.expect(all(len(v) == 1 for v in wflags.values()), "a worker flag is repeated")
    check_int_flags(wflags, "worker", check)
    wfirst = {k: v[0] for k, v in wflags.items()}
    check.expect(wfirst.get("host") == "0.0.0.0", "worker --host must be 0.0.0.0")
    check.expect(wfirst.get("port") == str(w_grpc), f"worker --port must be {w_grpc}")
    check.expect(wfirst.get("metrics_port") == str(w_metrics),
                 f"worker --metrics_port must be {w_metrics}")
    check.expect(wfirst.get("backend") == ("cpu" if cpu else "cuda"),
                 f"worker --backend={wfirst.get('backend')} in {'cpu' if cpu else 'gpu'} mode")
    threads = values["cpuOnly"]["threads"] if cpu else worker_v["threads"]
    check.expect(wfirst.get("threads") == str(threads), f"worker --threads={wfirst.get('threads')}")
    for flag, key in (("binding_lease_s", "bindingLeaseS"),
                      ("rendezvous_timeout_s", "rendezvousTimeoutS")):
        check.expect(wfirst.get(flag) == str(worker_v[key]),
                     f"worker --{flag}={wfirst.get(flag)} != worker.{key}={worker_v[key]}")
    lease = wfirst.get("binding_lease_s", "")
    check.expect(lease.isdigit() and int(lease) > IDLE_CHECK_S,
                 f"worker --binding_lease_s={lease} must exceed the scheduler's idle checks "
                 f"(every {IDLE_CHECK_S} s), or an idle scheduler loses its workers")
    expected_ports = {"grpc": w_grpc, "metrics": w_metrics}
    if w_health:
        expected_ports["health"] = w_health
    check.expect(container_ports(wc) == expected_ports,
                 f"worker container ports {container_ports(wc)}, expected {expected_ports}")
    check_probes(wc, w_health or w_grpc, "worker", check)
    # The other ranks dial rank 0's rendezvous store at its --collective_host, and with
    # mTLS check that name against its certificate: the same stable name as in --workers.
    pod_name_env = [e for e in wc.get("env", []) if e.get("name") == "POD_NAME"]
    check.expect(len(pod_name_env) == 1 and pod_name_env[0].get("valueFrom", {}).get("fieldRef", {})
                 .get("fieldPath") == "metadata.name", "worker env POD_NAME must be the pod's name")
    expected_host = f"$(POD_NAME).{svc_name}.{args.namespace}.svc.{values['clusterDomain']}"
    check.expect(wfirst.get("collective_host") == expected_host,
                 f"worker --collective_host={wfirst.get('collective_host')}, expected {expected_host}")
    if c.internal_tls["enabled"]:
        secret = c.internal_tls["workerSecretName"]
        for flag, key in (("tls_cert_file", "tls.crt"), ("tls_key_file", "tls.key"),
                          ("tls_ca_file", "ca.crt")):
            check_secret_file(worker_pod, wc, wfirst, flag, secret, key, "worker", check)
        check.expect(wfirst.get("tls_refresh_s") == str(values["tls"]["refreshSeconds"]),
                     f"worker --tls_refresh_s={wfirst.get('tls_refresh_s')}")
        check.expect(wfirst.get("health_port") == str(w_health),
                     f"worker --health_port={wfirst.get('health_port')}, expected {w_health}")
    res = wc.get("resources") or {}
    if cpu:
        check.expect(c.gpu_name not in resource_names(wc), "cpuOnly: workers must not request a GPU")
    else:
        for part in ("requests", "limits"):
            got = (res.get(part) or {}).get(c.gpu_name)
            check.expect(got == 1, f"worker {part}.{c.gpu_name} = {got}, expected 1 per pod")
    env = {e["name"] for e in wc.get("env", [])}
    check.expect(("NCCL_SOCKET_IFNAME" in env) != cpu, "NCCL env hints belong to GPU mode only")
    image = wc.get("image", "")
    check.expect(image.endswith("-cpu") == (cpu and not worker_v["image"]["tag"]),
                 f"worker image {image} for cpuOnly={cpu}")

    # Volumes: the model read-only at the model path in both pods; /dev/shm in memory.
    for who, pod, container in (("scheduler", sched_pod, sc), ("worker", worker_pod, wc)):
        mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
        model_mount = mounts.get(values["model"]["path"])
        check.expect(model_mount and model_mount.get("readOnly") is True,
                     f"{who}: model must be mounted read-only at {values['model']['path']}")
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        if model_mount:
            vol = volumes.get(model_mount["name"], {})
            kind = values["model"]["volume"]["type"]
            check.expect(kind in vol, f"{who}: model volume is not a {kind}: {vol}")
        sec = container.get("securityContext") or {}
        check.expect(sec.get("allowPrivilegeEscalation") is False and
                     (pod["spec"].get("securityContext") or {}).get("runAsNonRoot") is True,
                     f"{who}: must run as non-root without privilege escalation")
    shm = {m["mountPath"]: m["name"] for m in wc.get("volumeMounts", [])}.get("/dev/shm")
    shm_vol = next((v for v in worker_pod["spec"]["volumes"] if v["name"] == shm), {})
    check.expect(shm_vol.get("emptyDir", {}).get("medium") == "Memory",
                 "worker /dev/shm must be a memory-backed emptyDir")
    pre_stop = wc.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = int(pre_stop[-1]) if pre_stop else 0
    wgrace = worker_pod["spec"].get("terminationGracePeriodSeconds", 30)
    check.expect(wgrace > sleep, f"worker terminationGracePeriodSeconds={wgrace} <= preStop sleep {sleep}")
    if worker_v["waitForSchedulerDrain"]:
        check.expect(sleep >= drain, f"workers must outlive the scheduler's drain ({sleep} < {drain})")

    # --- The group's headless Service: its ranks' stable names.
    check.expect(subset(headless["spec"]["selector"], worker_labels) and
                 not subset(headless["spec"]["selector"], sched_labels),
                 "headless Service does not select exactly the worker pods")
    check.expect(svc_ports(headless) == {"grpc": (w_grpc, "grpc"), "metrics": (w_metrics, "metrics")},
                 f"headless Service ports {svc_ports(headless)}")
    check.expect(headless["spec"].get("publishNotReadyAddresses") is True,
                 "headless Service must publish not-ready addresses (ranks resolve before Ready)")


def svc_ports(svc):
    return {p["name"]: (p["port"], p.get("targetPort")) for p in svc["spec"]["ports"]}


def check_groups_apart(groups, objs, c, check):
    """No selector, Service, policy, worker address or identity of one group reaches another."""
    for i, (deploy, sts, headless) in enumerate(groups):
        for j, (other_deploy, other_sts, _) in enumerate(groups):
            if i == j:
                continue
            check.expect(not subset(deploy["spec"]["selector"]["matchLabels"], pod_labels(other_deploy)),
                         f"group {i}'s scheduler Deployment selects group {j}'s scheduler pods")
            check.expect(not subset(sts["spec"]["selector"]["matchLabels"], pod_labels(other_sts)),
                         f"group {i}'s StatefulSet selects group {j}'s worker pods")
            check.expect(not subset(headless["spec"]["selector"], pod_labels(other_sts)),
                         f"group {i}'s headless Service selects group {j}'s worker pods")
            workers = parse_args(deploy["spec"]["template"]["spec"]["containers"][0]).get("workers", [""])[0]
            other = other_sts["metadata"]["name"]
            check.expect(not any(w.split(".")[0].rsplit("-", 1)[0] == other for w in workers.split(",")),
                         f"group {i}'s scheduler --workers lists group {j}'s ranks ({other})")
    names = [sts["metadata"]["name"] for _, sts, _ in groups]
    check.expect(len(set(names)) == len(names), f"groups share a worker StatefulSet name: {names}")
    # Two schedulers presenting one id would both drive the same bound workers' lease.
    refs = []
    for deploy, _, _ in groups:
        env = deploy["spec"]["template"]["spec"]["containers"][0].get("env") or []
        ref = next(((e.get("valueFrom") or {}).get("secretKeyRef") or {} for e in env
                    if e.get("name") == ID_ENV), {})
        refs.append((ref.get("name"), ref.get("key")))
    check.expect(len(set(refs)) == len(refs),
                 f"groups share a scheduler identity (Secret, key): {refs}")
    secrets = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Secret"}
    ids = [(secrets.get(name) or {}).get("data", {}).get(key) for name, key in refs]
    ids = [x for x in ids if x]
    check.expect(len(set(ids)) == len(ids), "two groups' identity Secrets hold the same id")


def check_client_service(svc, c, check):
    """The scheduler Service: every group's schedulers (any replica), nothing else."""
    for i, labels in enumerate(c.sched_pods):
        check.expect(subset(svc["spec"]["selector"], labels),
                     f"scheduler Service does not select the scheduler pods (group {i})")
    for labels in c.worker_pods + list(c.other_pods.values()):
        check.expect(not subset(svc["spec"]["selector"], labels),
                     "scheduler Service does not select exactly the scheduler pods")
    expected_svc = {"grpc": (c.s_grpc, "grpc"), "metrics": (c.s_metrics, "metrics")}
    if c.s_http:
        expected_svc["http"] = (c.s_http, "http")
    check.expect(svc_ports(svc) == expected_svc,
                 f"scheduler Service ports {svc_ports(svc)}, expected {expected_svc}")


def check_service_monitor(objs, services, c, args, check):
    sms = [o for o in objs if o.get("kind") == "ServiceMonitor"]
    if not c.values["metrics"]["serviceMonitor"]["enabled"]:
        check.expect(not sms, "ServiceMonitor rendered although disabled")
        return
    check.expect(len(sms) == 1, f"expected one ServiceMonitor, found {len(sms)}")
    for sm in sms:
        check.expect(sm["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
        sel = sm["spec"]["selector"]
        # Every Service with a metrics port: each group's, the scheduler's, router, picker.
        for svc in services:
            names = {p["name"] for p in svc["spec"]["ports"]}
            if "metrics" not in names:
                continue
            labels = svc["metadata"]["labels"]
            ok = subset(sel.get("matchLabels", {}), labels) and all(
                (labels.get(e["key"]) in e.get("values", [])) == (e["operator"] == "In")
                for e in sel.get("matchExpressions", []))
            check.expect(ok, f"ServiceMonitor does not select Service {svc['metadata']['name']}")
            check.expect(all(ep.get("port") in names for ep in sm["spec"]["endpoints"]),
                         f"ServiceMonitor endpoint port not on {svc['metadata']['name']}")
        check.expect(args.namespace in sm["spec"].get("namespaceSelector", {}).get("matchNames", []),
                     "ServiceMonitor must look in the release namespace")
        if c.n > 1:
            relabels = [r for ep in sm["spec"]["endpoints"] for r in ep.get("relabelings", [])]
            # Prometheus writes a label name's other characters as "_".
            source = "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", GROUP_LABEL)
            check.expect(any(r.get("sourceLabels") == [source] for r in relabels),
                         f"ServiceMonitor does not keep the replica group ({source})")


def check_network_policies(objs, groups, c, check):
    policies = [o for o in objs if o.get("kind") == "NetworkPolicy"]
    if not c.values["networkPolicy"]["enabled"]:
        check.expect(not policies, "NetworkPolicy rendered although disabled")
        return
    monitoring = c.monitoring
    probe_sources = c.values["networkPolicy"].get("probeSources") or []
    clients = c.values["networkPolicy"]["clients"]

    def selecting(labels):
        return [p for p in policies if subset(p["spec"]["podSelector"].get("matchLabels"), labels)]

    for i, (deploy, sts, _) in enumerate(groups):
        sched_labels, worker_labels = c.sched_pods[i], c.worker_pods[i]
        others = [labels for j, labels in enumerate(c.worker_pods) if j != i]
        other_scheds = [labels for j, labels in enumerate(c.sched_pods) if j != i]
        worker_np, sched_np = selecting(worker_labels), selecting(sched_labels)
        check.expect(len(worker_np) == 1 and worker_np[0] not in sched_np,
                     "expected one NetworkPolicy selecting exactly the worker pods")
        check.expect(len(sched_np) == 1, "expected one NetworkPolicy selecting the scheduler pods")
        if not worker_np:
            continue
        np = worker_np[0]
        check.expect(not any(subset(np["spec"]["podSelector"].get("matchLabels"), o) for o in others),
                     f"group {i}'s worker NetworkPolicy also selects another group's workers")
        check.expect("Ingress" in np["spec"].get("policyTypes", []),
                     "worker policy must restrict Ingress")
        peers = peers_allowed_on(np, c.w_grpc)
        from_scheduler = [p for p in peers if p and set(p) == {"podSelector"} and
                          p["podSelector"].get("matchLabels") ==
                          deploy["spec"]["selector"]["matchLabels"] and
                          subset(p["podSelector"]["matchLabels"], sched_labels) and
                          not subset(p["podSelector"]["matchLabels"], worker_labels)]
        check.expect(from_scheduler, f"worker port {c.w_grpc} is not open to the scheduler pods")
        for peer in peers:
            # Besides the group's scheduler, only the other ranks of the group (collectives).
            ok = peer is not None and set(peer) == {"podSelector"} and (
                subset(peer["podSelector"].get("matchLabels"), sched_labels) or
                subset(peer["podSelector"].get("matchLabels"), worker_labels))
            check.expect(ok, f"worker port {c.w_grpc} is open to {peer or 'any source'}")
            if ok:
                sel = peer["podSelector"].get("matchLabels")
                check.expect(not any(subset(sel, o) for o in others + other_scheds),
                             f"group {i}'s worker port {c.w_grpc} is open to another group's pods ({sel})")
        for peer in peers_allowed_on(np, c.w_metrics):
            ok = peer is not None and (
                peer.get("namespaceSelector") == monitoring or
                (set(peer) == {"podSelector"} and
                 subset(peer["podSelector"].get("matchLabels"), worker_labels)))
            check.expect(ok, f"worker metrics port is open to {peer or 'any source'}")
        check.expect(any(p and p.get("namespaceSelector") == monitoring
                         for p in peers_allowed_on(np, c.w_metrics)),
                     "worker metrics port is not open to the monitoring namespace")
        if c.w_health:
            # Plaintext health: the group's ranks (they may reach any port) and the
            # configured probe sources, nobody else.
            for peer in peers_allowed_on(np, c.w_health):
                ok = peer is not None and (peer in probe_sources or (
                    set(peer) == {"podSelector"} and
                    subset(peer["podSelector"].get("matchLabels"), worker_labels)))
                check.expect(ok, f"worker health port is open to {peer or 'any source'}")
            for peer in probe_sources:
                check.expect(peer in peers_allowed_on(np, c.w_health),
                             f"worker health port is not open to probe source {peer}")

    sched_nps = selecting(c.sched_pods[0])
    if len(sched_nps) != 1:
        return
    np = sched_nps[0]
    for i, labels in enumerate(c.sched_pods):
        check.expect(np in selecting(labels), f"the scheduler NetworkPolicy misses group {i}'s scheduler")
    peers = peers_allowed_on(np, c.s_grpc)
    check.expect(peers == (clients or [None]),
                 f"scheduler gRPC port peers {peers}, expected {clients or 'any source'}")
    if c.s_http:
        # The router and the endpoint picker (its /metrics scrape) call every scheduler's
        # HTTP port: with clients restricted, they are admitted by their own pod labels.
        routed = [c.other_pods[who] for who in ("router", "endpoint-picker") if who in c.other_pods]
        peers = peers_allowed_on(np, c.s_http)
        if clients:
            extra = [p for p in peers if p not in clients]
            check.expect(all(p in peers for p in clients),
                         f"scheduler HTTP port peers {peers} miss networkPolicy.clients {clients}")
            for labels in routed:
                check.expect(any(p and set(p) == {"podSelector"} and
                                 subset(p["podSelector"].get("matchLabels"), labels) for p in extra),
                             f"scheduler HTTP port is not open to the {labels.get('app.kubernetes.io/component')} pods")
            for p in extra:
                sel = (p or {}).get("podSelector", {}).get("matchLabels") if p and set(p) == {"podSelector"} else None
                check.expect(sel and any(subset(sel, labels) for labels in routed) and
                             not any(subset(sel, labels) for labels in c.worker_pods + c.sched_pods),
                             f"scheduler HTTP port is open to {p or 'any source'}")
        else:
            check.expect(peers == [None], f"scheduler HTTP port peers {peers}, expected any source")
    check.expect(all(p and p.get("namespaceSelector") == monitoring
                     for p in peers_allowed_on(np, c.s_metrics)) and peers_allowed_on(np, c.s_metrics),
                 "scheduler metrics port must be open to the monitoring namespace only")
    if c.s_health:
        peers = peers_allowed_on(np, c.s_health)
        check.expect(peers == probe_sources,
                     f"scheduler health port peers {peers}, expected {probe_sources}")
    if c.router:
        nps = selecting(c.other_pods.get("router", {"app.kubernetes.io/component": "router"}))
        check.expect(len(nps) == 1, "expected one NetworkPolicy selecting the router pods")
        for rnp in nps:
            peers = peers_allowed_on(rnp, c.router["port"])
            check.expect(peers == (clients or [None]),
                         f"router port peers {peers}, expected {clients or 'any source'}")
            check.expect(peers_allowed_on(rnp, c.router["metricsPort"]) == [dict(namespaceSelector=monitoring,
                         **({"podSelector": c.values["networkPolicy"]["monitoring"]["podSelector"]}
                            if c.values["networkPolicy"]["monitoring"]["podSelector"] else {}))],
                         "router metrics port must be open to the monitoring namespace only")
    if c.pool:
        nps = selecting(c.other_pods.get("endpoint-picker", {"app.kubernetes.io/component": "endpoint-picker"}))
        check.expect(len(nps) == 1, "expected one NetworkPolicy selecting the endpoint picker pods")
        for enp in nps:
            check.expect(all(p and p.get("namespaceSelector") == monitoring
                             for p in peers_allowed_on(enp, EPP_METRICS_PORT)),
                         "endpoint picker metrics port must be open to the monitoring namespace only")


def router_flags(container):
    """The router's arguments -> (subcommand, {flag: [values]}); a flag takes the words up
    to the next flag (argparse nargs='+'), or one after '='."""
    words = [str(a) for a in container.get("args", [])]
    sub = []
    while words and not words[0].startswith("--"):
        sub.append(words.pop(0))
    flags, name = {}, None
    for word in words:
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            flags.setdefault(name, [])
            if eq:
                flags[name].append(value)
                name = None
        elif name is not None:
            flags[name].append(word)
        else:
            flags.setdefault("", []).append(word)
    return sub, flags


def check_router(objs, c, args, check):
    """The router: service discovery of exactly this release's scheduler pods, at the
    HTTP port, in this namespace, with a policy its type has."""
    routers = [o for o in objs if component(o) == "router"]
    if not c.router:
        check.expect(not routers, "router objects rendered although router.enabled is false")
        return
    deploys = [o for o in routers if o["kind"] == "Deployment"]
    check.expect(len(deploys) == 1, f"expected one router Deployment, found {len(deploys)}")
    if not deploys:
        return
    deploy = deploys[0]
    r = c.router
    rtype = r["type"]
    pod = deploy["spec"]["template"]
    check.expect(deploy["spec"].get("replicas") == r["replicas"], "router replicas != router.replicas")
    check.expect(subset(deploy["spec"]["selector"]["matchLabels"], pod_labels(deploy)) and
                 not any(subset(deploy["spec"]["selector"]["matchLabels"], labels)
                         for labels in c.sched_pods + c.worker_pods),
                 "router Deployment selector does not select exactly its own pods")
    container = pod["spec"]["containers"][0]
    sub, flags = router_flags(container)
    check.expect(sub == ROUTER_SUBCOMMAND[rtype],
                 f"router arguments start with {sub}, {rtype} needs {ROUTER_SUBCOMMAND[rtype]}")
    check.expect("" not in flags, f"router has stray arguments {flags.get('')}")
    expected = {"host", "port", "policy", "service-discovery", "selector", "service-discovery-port",
                "service-discovery-namespace", "health-check-interval-secs", "prometheus-host",
                "prometheus-port", "log-level"}
    extra = {a.lstrip("-").partition("=")[0] for a in r.get("extraArgs") or []}
    check.expect(set(flags) - extra == expected,
                 f"router flags {sorted(flags)} != {sorted(expected)}")
    check.expect(all(len(v) == 1 for k, v in flags.items() if k not in ("selector", "service-discovery")),
                 "a router flag is repeated")
    one = {k: v[0] if v else None for k, v in flags.items()}
    check.expect(one.get("host") == "0.0.0.0", "router --host must be 0.0.0.0")
    check.expect(one.get("port") == str(r["port"]), f"router --port={one.get('port')}, expected {r['port']}")
    check.expect(one.get("policy") == r["policy"] and r["policy"] in ROUTER_POLICIES[rtype],
                 f"router --policy={one.get('policy')}: not router.policy or not a {rtype} policy "
                 f"({', '.join(ROUTER_POLICIES[rtype])})")
    check.expect(flags.get("service-discovery") == [], "router --service-discovery takes no value")
    check.expect(one.get("service-discovery-port") == str(c.s_http),
                 f"router --service-discovery-port={one.get('service-discovery-port')}, expected the "
                 f"schedulers' HTTP port {c.s_http}")
    check.expect(one.get("service-discovery-namespace") == args.namespace,
                 f"router --service-discovery-namespace={one.get('service-discovery-namespace')}, "
                 f"expected {args.namespace}")
    pairs = [w.partition("=") for w in flags.get("selector", [])]
    selector = {k: v for k, eq, v in pairs if eq}
    check.expect(len(selector) == len(pairs) and selector,
                 f"router --selector {flags.get('selector')} must be key=value words")
    check_selects_schedulers(selector, "router --selector", c, check)
    check.expect(one.get("prometheus-port") == str(r["metricsPort"]),
                 f"router --prometheus-port={one.get('prometheus-port')}, expected {r['metricsPort']}")
    check.expect(one.get("health-check-interval-secs") == str(r["healthCheckIntervalS"]),
                 "router --health-check-interval-secs != router.healthCheckIntervalS")
    check.expect(one.get("log-level") == r["logLevel"], "router --log-level != router.logLevel")
    ports = container_ports(container)
    check.expect(ports == {"http": r["port"], "metrics": r["metricsPort"]},
                 f"router container ports {ports}")
    for probe, path in (("livenessProbe", "/liveness"), ("readinessProbe", "/readiness")):
        get = (container.get(probe) or {}).get("httpGet") or {}
        check.expect(get.get("path") == path and get.get("port") in ("http", r["port"]),
                     f"router {probe} must GET {path} on the router's port, got {container.get(probe)}")
    if not r["image"]["tag"]:
        tag = f"{rtype}-{ROUTER_PINS[rtype]}"
        check.expect(container.get("image") == f"{r['image']['repository']}:{tag}",
                     f"router image {container.get('image')}: the default tag is {tag} "
                     "(what router.Dockerfile builds)")
    sec = container.get("securityContext") or {}
    check.expect(sec.get("allowPrivilegeEscalation") is False and
                 (pod["spec"].get("securityContext") or {}).get("runAsNonRoot") is True,
                 "router: must run as non-root without privilege escalation")
    services = [o for o in routers if o["kind"] == "Service"]
    check.expect(len(services) == 1, "expected one router Service")
    for svc in services:
        check.expect(subset(svc["spec"]["selector"], pod_labels(deploy)) and
                     not any(subset(svc["spec"]["selector"], labels)
                             for labels in c.sched_pods + c.worker_pods),
                     "router Service does not select exactly the router pods")
        check.expect(svc_ports(svc) == {"http": (r["port"], "http"), "metrics": (r["metricsPort"], "metrics")},
                     f"router Service ports {svc_ports(svc)}")
    check_api_account(objs, pod, "router", ROUTER_RULES, args, check)


def check_selects_schedulers(selector, who, c, check):
    """A selector of every group's scheduler pods of this release and of nothing else."""
    check.expect(all(subset(selector, labels) for labels in c.sched_pods),
                 f"{who} {selector} does not select every group's scheduler pods")
    others = c.worker_pods + list(c.other_pods.values())
    check.expect(not any(subset(selector, labels) for labels in others),
                 f"{who} {selector} also selects pods other than the schedulers")
    instance = c.sched_pods[0].get("app.kubernetes.io/instance")
    check.expect(selector.get("app.kubernetes.io/instance") == instance and
                 selector.get("app.kubernetes.io/component") == "scheduler" and
                 GROUP_LABEL not in selector,
                 f"{who} {selector} must name this release's instance ({instance}) and the "
                 "scheduler component, and no group (other releases' schedulers stay out)")


def check_api_account(objs, pod, who, rules, args, check):
    """A pod that calls the Kubernetes API: its own ServiceAccount, bound to one Role with
    exactly `rules` in this namespace."""
    account = pod["spec"].get("serviceAccountName")
    check.expect(("ServiceAccount", account) in {(o["kind"], o["metadata"]["name"]) for o in objs},
                 f"{who}: ServiceAccount {account} not rendered")
    check.expect(pod["spec"].get("automountServiceAccountToken") is not False,
                 f"{who}: needs its API token mounted")
    bindings = [b for b in objs if b.get("kind") == "RoleBinding" and
                any(s.get("kind") == "ServiceAccount" and s.get("name") == account
                    for s in b.get("subjects", []))]
    check.expect(len(bindings) == 1, f"{who}: expected one RoleBinding of {account}, found {len(bindings)}")
    for binding in bindings:
        check.expect(binding.get("subjects") == [{"kind": "ServiceAccount", "name": account,
                                                  "namespace": args.namespace}],
                     f"{who}: RoleBinding {binding['metadata']['name']} binds {binding.get('subjects')}")
        ref = binding.get("roleRef") or {}
        roles = [o for o in objs if o.get("kind") == "Role" and o["metadata"]["name"] == ref.get("name")]
        check.expect(ref.get("kind") == "Role" and ref.get("apiGroup") == "rbac.authorization.k8s.io" and
                     len(roles) == 1, f"{who}: RoleBinding must refer to a rendered Role, got {ref}")
        for role in roles:
            got = sorted((tuple(sorted(r.get("apiGroups", []))), tuple(sorted(r.get("resources", []))),
                          tuple(sorted(r.get("verbs", [])))) for r in role.get("rules", []))
            check.expect(got == sorted(rules),
                         f"{who}: Role {role['metadata']['name']} rules {got}, expected exactly {sorted(rules)}")


def check_inference_pool(objs, c, args, check):
    """The InferencePool selects every group's scheduler at the HTTP port and names the
    endpoint picker's Service and port; the picker reads Conveyor's metric names."""
    pools = [o for o in objs if o.get("kind") == "InferencePool"]
    epp = [o for o in objs if component(o) == "endpoint-picker"]
    if not c.pool:
        check.expect(not pools and not epp, "InferencePool / endpoint picker rendered although disabled")
        return
    check.expect(len(pools) == 1, f"expected one InferencePool, found {len(pools)}")
    deploys = [o for o in epp if o["kind"] == "Deployment"]
    services = [o for o in epp if o["kind"] == "Service"]
    check.expect(len(deploys) == 1 and len(services) == 1,
                 "expected one endpoint picker Deployment and Service")
    if len(pools) != 1 or len(deploys) != 1 or len(services) != 1:
        return
    pool, deploy, svc = pools[0], deploys[0], services[0]
    spec = pool.get("spec") or {}
    check.expect(pool.get("apiVersion") == "inference.networking.k8s.io/v1",
                 f"InferencePool apiVersion {pool.get('apiVersion')}, expected inference.networking.k8s.io/v1")
    check.expect(set(spec.get("selector") or {}) == {"matchLabels"},
                 f"InferencePool selector must be matchLabels only: {spec.get('selector')}")
    check_selects_schedulers((spec.get("selector") or {}).get("matchLabels") or {},
                             "InferencePool selector", c, check)
    check.expect(spec.get("targetPorts") == [{"number": c.s_http}],
                 f"InferencePool targetPorts {spec.get('targetPorts')}, expected [{{number: {c.s_http}}}] "
                 "(the schedulers' HTTP port)")
    ref = spec.get("endpointPickerRef") or {}
    check.expect(ref.get("name") == svc["metadata"]["name"] and ref.get("kind", "Service") == "Service" and
                 ref.get("group", "") == "",
                 f"InferencePool endpointPickerRef {ref} does not name the endpoint picker Service "
                 f"{svc['metadata']['name']}")
    check.expect(ref.get("failureMode") == c.pool["failureMode"],
                 f"InferencePool failureMode {ref.get('failureMode')} != inferencePool.failureMode")
    port = (ref.get("port") or {}).get("number")
    svc_port = next((p for p in svc["spec"]["ports"] if p.get("port") == port), None)
    check.expect(svc_port is not None and svc_port.get("appProtocol") == "http2",
                 f"InferencePool endpointPickerRef port {port} is not an http2 (ext-proc) port of "
                 f"Service {svc['metadata']['name']}: {svc['spec']['ports']}")
    pod = deploy["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = container_ports(container)
    target = (svc_port or {}).get("targetPort")
    flags = parse_args(container)
    one = {k: v[0] for k, v in flags.items()}
    check.expect(all(len(v) == 1 for v in flags.values()), "an endpoint picker flag is repeated")
    check.expect(ports.get(target, target) == port and one.get("grpc-port") == str(port),
                 f"endpoint picker: Service port {port} -> {target} is not its --grpc-port "
                 f"{one.get('grpc-port')} (container ports {ports})")
    check.expect(subset(svc["spec"]["selector"], pod_labels(deploy)) and
                 not any(subset(svc["spec"]["selector"], labels) for labels in c.sched_pods + c.worker_pods),
                 "endpoint picker Service does not select exactly the endpoint picker pods")
    metric_flags = {k: one.get(k) for k in EPP_METRIC_FLAGS}
    check.expect(metric_flags == EPP_METRIC_FLAGS,
                 f"endpoint picker metric flags {metric_flags}, expected {EPP_METRIC_FLAGS} (docs/scaling.md)")
    check.expect(one.get("pool-name") == pool["metadata"]["name"] and one.get("pool-namespace") == args.namespace,
                 f"endpoint picker --pool-name/--pool-namespace {one.get('pool-name')}/{one.get('pool-namespace')}"
                 f" != InferencePool {args.namespace}/{pool['metadata']['name']}")
    check.expect(one.get("pool-group", "inference.networking.k8s.io") == "inference.networking.k8s.io",
                 "endpoint picker --pool-group must be the GA group inference.networking.k8s.io")
    check.expect(one.get("metrics-port") == str(EPP_METRICS_PORT) and ports.get("metrics") == EPP_METRICS_PORT,
                 "endpoint picker --metrics-port / metrics container port")
    health = one.get("grpc-health-port")
    for probe in ("livenessProbe", "readinessProbe"):
        grpc = (container.get(probe) or {}).get("grpc") or {}
        check.expect(str(grpc.get("port")) == health and grpc.get("service") == "inference-extension",
                     f"endpoint picker {probe} must be gRPC health on --grpc-health-port {health}")
    config = one.get("config-file", "")
    directory, _, filename = config.rpartition("/")
    mount = next((m for m in container.get("volumeMounts", []) if m.get("mountPath") == directory), {})
    volume = next((v for v in pod["spec"].get("volumes", []) if v["name"] == mount.get("name")), {})
    maps = [o for o in objs if o.get("kind") == "ConfigMap" and
            o["metadata"]["name"] == (volume.get("configMap") or {}).get("name")]
    check.expect(len(maps) == 1 and filename in (maps[0].get("data") or {}),
                 f"endpoint picker --config-file={config} is not a key of a rendered ConfigMap")
    for cm in maps:
        cfg = yaml.safe_load((cm.get("data") or {}).get(filename, "")) or {}
        check.expect(cfg.get("kind") == "EndpointPickerConfig", "endpoint picker config is not an EndpointPickerConfig")
    check.expect(deploy["spec"].get("replicas") == 1, "endpoint picker replicas must be 1 (no leader election)")
    check_api_account(objs, pod, "endpoint picker", EPP_RULES, args, check)


def check_rbac(objs, c, args, check):
    """Only what service discovery needs: namespaced Roles, nothing cluster-wide."""
    cluster = [o["metadata"]["name"] for o in objs if o.get("kind") in ("ClusterRole", "ClusterRoleBinding")]
    check.expect(not cluster, f"cluster-wide RBAC rendered: {cluster}")
    expected = (ROUTER_RULES if c.router else []) + (EPP_RULES if c.pool else [])
    rules = [r for o in objs if o.get("kind") == "Role" for r in o.get("rules", [])]
    for rule in rules:
        verbs = set(rule.get("verbs", []))
        check.expect(verbs <= {"get", "list", "watch"} and "*" not in rule.get("resources", []) and
                     "*" not in rule.get("apiGroups", []),
                     f"Role rule {rule} grants more than get/list/watch of named resources")
    check.expect(len(rules) == len(expected), f"expected {len(expected)} Role rules, found {len(rules)}")
    roles = [o for o in objs if o.get("kind") in ("Role", "RoleBinding")]
    if not expected:
        check.expect(not roles, "Roles rendered without a router or an endpoint picker")


def check_scheduler_security(pod, container, flags, values, health_port, check):
    """The scheduler's TLS, mTLS-to-workers and token flags, from the right Secrets."""
    client_tls, internal_tls = values["tls"]["clientApi"], values["tls"]["internal"]
    auth = values["auth"]
    if client_tls["enabled"]:
        secret = client_tls["secretName"]
        check_secret_file(pod, container, flags, "tls_cert_file", secret, "tls.crt", "scheduler", check)
        check_secret_file(pod, container, flags, "tls_key_file", secret, "tls.key", "scheduler", check)
        if client_tls["requireClientCert"]:
            check_secret_file(pod, container, flags, "tls_client_ca_file",
                              client_tls["clientCaSecretName"] or secret, "ca.crt", "scheduler", check)
        check.expect(flags.get("health_port") == str(health_port),
                     f"scheduler --health_port={flags.get('health_port')}, expected {health_port}")
    if internal_tls["enabled"]:
        secret = internal_tls["schedulerSecretName"]
        for flag, key in (("worker_tls_cert_file", "tls.crt"), ("worker_tls_key_file", "tls.key"),
                          ("worker_tls_ca_file", "ca.crt")):
            check_secret_file(pod, container, flags, flag, secret, key, "scheduler", check)
    if client_tls["enabled"] or internal_tls["enabled"]:
        check.expect(flags.get("tls_refresh_s") == str(values["tls"]["refreshSeconds"]),
                     f"scheduler --tls_refresh_s={flags.get('tls_refresh_s')}")
    if auth["tokensSecretName"]:
        check_secret_file(pod, container, flags, "auth_tokens_file", auth["tokensSecretName"],
                          auth["tokensKey"], "scheduler", check)
        check.expect(flags.get("max_concurrent_requests_per_token") == str(auth["maxConcurrentPerToken"]),
                     f"scheduler --max_concurrent_requests_per_token="
                     f"{flags.get('max_concurrent_requests_per_token')} != auth.maxConcurrentPerToken")
    # No Secret volume beyond what the flags use (nor a forgotten TLS file on a plaintext port).
    secret_volumes = {v["name"] for v in pod["spec"].get("volumes", []) if "secret" in v}
    used = set()
    for name, path in flags.items():
        if name.endswith("_file"):
            mounts = [m for m in container.get("volumeMounts", [])
                      if m.get("mountPath") == str(path).rpartition("/")[0]]
            used.update(m["name"] for m in mounts)
    check.expect(secret_volumes <= used,
                 f"scheduler: Secret volumes {sorted(secret_volumes - used)} are mounted but no flag reads them")


def check_identity(i, objs, deploy, container, flags, c, args, check):
    """Group i's scheduler id: a Secret -> env (secretKeyRef) -> --scheduler_id=$(ENV). Each
    group has a Secret of its own (<...>-<i>-scheduler-id with several groups), or reads its
    own key (<key>-<i>) of a shared existingSecret."""
    identity = c.sched_v["identity"]
    existing = identity["existingSecret"]
    key = f"{identity['key']}-{i}" if existing and c.n > 1 else identity["key"]
    env_ref = next(((e.get("valueFrom") or {}).get("secretKeyRef") or {}
                    for e in container.get("env") or [] if e.get("name") == ID_ENV), {})
    if existing:
        secret_name = existing
    elif c.n == 1:
        secret_name = f"{deploy['metadata']['name']}-id"[:63].rstrip("-")
    elif str(env_ref.get("name", "")).endswith(f"-{i}-scheduler-id"):
        secret_name = env_ref["name"]
    else:
        secret_name = f"<release>-{i}-scheduler-id"
    check.expect(flags.get("scheduler_id") == f"$({ID_ENV})",
                 f"scheduler --scheduler_id={flags.get('scheduler_id')}, expected $({ID_ENV}) "
                 "(the id from the Secret, through the env)")
    env = container.get("env") or []
    names = [e.get("name") for e in env]
    check.expect(len(names) == len(set(names)), f"scheduler env names repeat: {names}")
    id_env = [e for e in env if e.get("name") == ID_ENV]
    ref = ((id_env[0].get("valueFrom") or {}).get("secretKeyRef") or {}) if id_env else {}
    check.expect(len(id_env) == 1 and "value" not in id_env[0] and not ref.get("optional") and
                 (ref.get("name"), ref.get("key")) == (secret_name, key),
                 f"scheduler env {ID_ENV} must come from secretKeyRef {secret_name}/{key} "
                 f"(not optional), got {id_env}")

    secrets = [o for o in objs if o.get("kind") == "Secret"]
    if existing:
        check.expect(not secrets, "the chart must not create a Secret when "
                     f"scheduler.identity.existingSecret is set ({existing}): {len(secrets)} rendered")
        return
    mine = [o for o in secrets if o["metadata"]["name"] == secret_name]
    check.expect(len(mine) == 1 and len(secrets) == c.n,
                 f"expected one Secret {secret_name} holding the scheduler's id (one per group), found "
                 f"{[s['metadata']['name'] for s in secrets]}")
    if len(mine) != 1:
        return
    secret = mine[0]
    data = secret.get("data") or {}
    check.expect(secret.get("type") == "Opaque" and set(data) == {key} and "stringData" not in secret,
                 f"Secret {secret_name} must be Opaque with exactly data.{key}, got "
                 f"type {secret.get('type')}, keys {sorted(data)}, stringData {'stringData' in secret}")
    try:
        scheduler_id = base64.b64decode(str(data.get(key, "")), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        scheduler_id = None
    check.expect(scheduler_id is not None and len(scheduler_id) == ID_LENGTH and scheduler_id.isalnum(),
                 f"Secret {secret_name} data.{key} must be base64 of a {ID_LENGTH}-character "
                 f"alphanumeric id, got {data.get(key)!r}")
    if args.lookup:
        with open(args.lookup, encoding="utf-8") as f:
            cluster = [d for d in yaml.safe_load_all(f) if d]
        before = [o for o in cluster if o.get("kind") == "Secret" and
                  o["metadata"].get("name") == secret_name and
                  o["metadata"].get("namespace") == args.namespace]
        check.expect(len(before) == 1, f"--lookup file has no Secret {args.namespace}/{secret_name}")
        if before:
            check.expect(data.get(key) == before[0]["data"][key],
                         f"Secret {secret_name} changed the scheduler's id on upgrade: "
                         f"{data.get(key)!r}, the cluster has {before[0]['data'][key]!r}")


def report(check):
    for failure in check.failures:
        print(f"FAIL {failure}")
    print(f"{check.count - len(check.failures)}/{check.count} manifest checks passed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
