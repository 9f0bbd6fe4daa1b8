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
import sys

import yaml

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


def only(objs, kind, check, what=None):
    found = [o for o in objs if o.get("kind") == kind]
    check.expect(len(found) == 1, f"expected exactly one {what or kind}, found {len(found)}")
    return found[0] if found else None


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
    tp = values["tensorParallelSize"]
    cpu = values["cpuOnly"]["enabled"]
    sched_v, worker_v = values["scheduler"], values["worker"]
    client_tls, internal_tls = values["tls"]["clientApi"], values["tls"]["internal"]
    auth = values["auth"]
    s_health = sched_v["healthPort"] if client_tls["enabled"] else None
    s_http = sched_v["httpPort"] or None
    w_health = worker_v["healthPort"] if internal_tls["enabled"] else None
    sched_flags = list(SCHEDULER_FLAGS)
    if client_tls["enabled"]:
        sched_flags += ["tls_cert_file", "tls_key_file", "health_port"]
        if client_tls["requireClientCert"]:
            sched_flags.append("tls_client_ca_file")
    if internal_tls["enabled"]:
        sched_flags += ["worker_tls_cert_file", "worker_tls_key_file", "worker_tls_ca_file"]
    if client_tls["enabled"] or internal_tls["enabled"]:
        sched_flags.append("tls_refresh_s")
    if auth["tokensSecretName"]:
        sched_flags += ["auth_tokens_file", "max_concurrent_requests_per_token"]
    if s_http:
        sched_flags.append("http_port")
    worker_flags = list(WORKER_FLAGS)
    if internal_tls["enabled"]:
        worker_flags += ["tls_cert_file", "tls_key_file", "tls_ca_file", "tls_refresh_s",
                         "health_port"]
    gpu_name = worker_v["gpuResourceName"]
    s_grpc, s_metrics = sched_v["grpcPort"], sched_v["metricsPort"]
    w_grpc, w_metrics = worker_v["grpcPort"], worker_v["metricsPort"]

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

    deploy = only(objs, "Deployment", check)
    sts = only(objs, "StatefulSet", check)
    services = [o for o in objs if o.get("kind") == "Service"]
    check.expect(len(services) == 2, f"expected 2 Services, found {len(services)}")
    headless = [s for s in services if s["spec"].get("clusterIP") == "None"]
    check.expect(len(headless) == 1, "expected exactly one headless Service (clusterIP: None)")
    if not (deploy and sts and len(headless) == 1 and len(services) == 2):
        return report(check)
    headless = headless[0]
    sched_svc = next(s for s in services if s is not headless)

    sched_pod = deploy["spec"]["template"]
    worker_pod = sts["spec"]["template"]
    sched_labels = sched_pod["metadata"]["labels"]
    worker_labels = worker_pod["metadata"]["labels"]
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
    check.expect(sorted(flags) == sorted(sched_flags),
                 f"scheduler flags {sorted(flags)} != {sorted(sched_flags)}")
    check.expect(all(len(v) == 1 for v in flags.values()), "a scheduler flag is repeated")
    check_int_flags(flags, "scheduler", check)
    first = {k: v[0] for k, v in flags.items()}
    check.expect(first.get("host") == "0.0.0.0", "scheduler --host must be 0.0.0.0")
    check.expect(first.get("port") == str(s_grpc),
                 f"scheduler --port={first.get('port')}, expected {s_grpc}")
    check.expect(first.get("metrics_port") == str(s_metrics),
                 f"scheduler --metrics_port={first.get('metrics_port')}, expected {s_metrics}")
    check.expect(first.get("model") == values["model"]["path"], "scheduler --model != model.path")
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
    check.expect(gpu_name not in resource_names(sc), "the scheduler must not request a GPU")
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

    check_identity(objs, deploy, sc, first, sched_v["identity"], args, check)

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
    expected = [f"{sts_name}-{i}.{svc_name}.{args.namespace}.svc.{values['clusterDomain']}:{w_grpc}"
                for i in range(tp)]
    check.expect(workers == expected, f"--workers={workers}, expected {expected}")

    containers = worker_pod["spec"]["containers"]
    check.expect(len(containers) == 1, "worker pod must have one container")
    wc = containers[0]
    wflags = parse_args(wc)
    check.expect(sorted(wflags) == sorted(worker_flags),
                 f"worker flags {sorted(wflags)} != {sorted(worker_flags)}")
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
    if internal_tls["enabled"]:
        secret = internal_tls["workerSecretName"]
        for flag, key in (("tls_cert_file", "tls.crt"), ("tls_key_file", "tls.key"),
                          ("tls_ca_file", "ca.crt")):
            check_secret_file(worker_pod, wc, wfirst, flag, secret, key, "worker", check)
        check.expect(wfirst.get("tls_refresh_s") == str(values["tls"]["refreshSeconds"]),
                     f"worker --tls_refresh_s={wfirst.get('tls_refresh_s')}")
        check.expect(wfirst.get("health_port") == str(w_health),
                     f"worker --health_port={wfirst.get('health_port')}, expected {w_health}")
    res = wc.get("resources") or {}
    if cpu:
        check.expect(gpu_name not in resource_names(wc), "cpuOnly: workers must not request a GPU")
    else:
        for part in ("requests", "limits"):
            got = (res.get(part) or {}).get(gpu_name)
            check.expect(got == 1, f"worker {part}.{gpu_name} = {got}, expected 1 per pod")
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

    # --- Services select the right pods, on the right ports.
    def svc_ports(svc):
        return {p["name"]: (p["port"], p.get("targetPort")) for p in svc["spec"]["ports"]}

    check.expect(subset(sched_svc["spec"]["selector"], sched_labels) and
                 not subset(sched_svc["spec"]["selector"], worker_labels),
                 "scheduler Service does not select exactly the scheduler pods")
    expected_svc = {"grpc": (s_grpc, "grpc"), "metrics": (s_metrics, "metrics")}
    if s_http:
        expected_svc["http"] = (s_http, "http")
    check.expect(svc_ports(sched_svc) == expected_svc,
                 f"scheduler Service ports {svc_ports(sched_svc)}, expected {expected_svc}")
    check.expect(subset(headless["spec"]["selector"], worker_labels) and
                 not subset(headless["spec"]["selector"], sched_labels),
                 "headless Service does not select exactly the worker pods")
    check.expect(svc_ports(headless) == {"grpc": (w_grpc, "grpc"), "metrics": (w_metrics, "metrics")},
                 f"headless Service ports {svc_ports(headless)}")
    check.expect(headless["spec"].get("publishNotReadyAddresses") is True,
                 "headless Service must publish not-ready addresses (ranks resolve before Ready)")

    # --- ServiceMonitor.
    sms = [o for o in objs if o.get("kind") == "ServiceMonitor"]
    if values["metrics"]["serviceMonitor"]["enabled"]:
        check.expect(len(sms) == 1, f"expected one ServiceMonitor, found {len(sms)}")
        for sm in sms:
            check.expect(sm["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion")
            sel = sm["spec"]["selector"]
            for svc in (sched_svc, headless):
                labels = svc["metadata"]["labels"]
                ok = subset(sel.get("matchLabels", {}), labels) and all(
                    (labels.get(e["key"]) in e.get("values", [])) == (e["operator"] == "In")
                    for e in sel.get("matchExpressions", []))
                check.expect(ok, f"ServiceMonitor does not select Service {svc['metadata']['name']}")
                names = {p["name"] for p in svc["spec"]["ports"]}
                check.expect(all(ep.get("port") in names for ep in sm["spec"]["endpoints"]),
                             f"ServiceMonitor endpoint port not on {svc['metadata']['name']}")
            check.expect(args.namespace in sm["spec"].get("namespaceSelector", {}).get("matchNames", []),
                         "ServiceMonitor must look in the release namespace")
    else:
        check.expect(not sms, "ServiceMonitor rendered although disabled")

    # --- NetworkPolicies.
    policies = [o for o in objs if o.get("kind") == "NetworkPolicy"]
    if values["networkPolicy"]["enabled"]:
        monitoring = values["networkPolicy"]["monitoring"]["namespaceSelector"]
        probe_sources = values["networkPolicy"].get("probeSources") or []
        def selecting(labels):
            return [p for p in policies
                    if subset(p["spec"]["podSelector"].get("matchLabels"), labels)]

        worker_np, sched_np = selecting(worker_labels), selecting(sched_labels)
        check.expect(len(worker_np) == 1 and worker_np[0] not in sched_np,
                     "expected one NetworkPolicy selecting exactly the worker pods")
        check.expect(len(sched_np) == 1, "expected one NetworkPolicy selecting the scheduler pods")
        if worker_np:
            np = worker_np[0]
            check.expect("Ingress" in np["spec"].get("policyTypes", []),
                         "worker policy must restrict Ingress")
            peers = peers_allowed_on(np, w_grpc)
            from_scheduler = [p for p in peers if p and set(p) == {"podSelector"} and
                              p["podSelector"].get("matchLabels") ==
                              deploy["spec"]["selector"]["matchLabels"] and
                              subset(p["podSelector"]["matchLabels"], sched_labels) and
                              not subset(p["podSelector"]["matchLabels"], worker_labels)]
            check.expect(from_scheduler, f"worker port {w_grpc} is not open to the scheduler pods")
            for peer in peers:
                # Besides the scheduler, only the other ranks of the group (collectives).
                ok = peer is not None and set(peer) == {"podSelector"} and (
                    subset(peer["podSelector"].get("matchLabels"), sched_labels) or
                    subset(peer["podSelector"].get("matchLabels"), worker_labels))
                check.expect(ok, f"worker port {w_grpc} is open to {peer or 'any source'}")
            for peer in peers_allowed_on(np, w_metrics):
                ok = peer is not None and (
                    peer.get("namespaceSelector") == monitoring or
                    (set(peer) == {"podSelector"} and
                     subset(peer["podSelector"].get("matchLabels"), worker_labels)))
                check.expect(ok, f"worker metrics port is open to {peer or 'any source'}")
            check.expect(any(p and p.get("namespaceSelector") == monitoring
                             for p in peers_allowed_on(np, w_metrics)),
                         "worker metrics port is not open to the monitoring namespace")
            if w_health:
                # Plaintext health: the group's ranks (they may reach any port) and the
                # configured probe sources, nobody else.
                for peer in peers_allowed_on(np, w_health):
                    ok = peer is not None and (peer in probe_sources or (
                        set(peer) == {"podSelector"} and
                        subset(peer["podSelector"].get("matchLabels"), worker_labels)))
                    check.expect(ok, f"worker health port is open to {peer or 'any source'}")
                for peer in probe_sources:
                    check.expect(peer in peers_allowed_on(np, w_health),
                                 f"worker health port is not open to probe source {peer}")
        if sched_np:
            np = sched_np[0]
            clients = values["networkPolicy"]["clients"]
            peers = peers_allowed_on(np, s_grpc)
            check.expect(peers == (clients or [None]),
                         f"scheduler gRPC port peers {peers}, expected {clients or 'any source'}")
            if s_http:
                peers = peers_allowed_on(np, s_http)
                check.expect(peers == (clients or [None]),
                             f"scheduler HTTP port peers {peers}, expected {clients or 'any source'}")
            check.expect(all(p and p.get("namespaceSelector") == monitoring
                             for p in peers_allowed_on(np, s_metrics)) and peers_allowed_on(np, s_metrics),
                         "scheduler metrics port must be open to the monitoring namespace only")
            if s_health:
                peers = peers_allowed_on(np, s_health)
                check.expect(peers == probe_sources,
                             f"scheduler health port peers {peers}, expected {probe_sources}")
    else:
        check.expect(not policies, "NetworkPolicy rendered although disabled")

    # --- Service account.
    for who, pod in (("scheduler", sched_pod), ("worker", worker_pod)):
        name = pod["spec"].get("serviceAccountName")
        if values["serviceAccount"]["create"]:
            check.expect(("ServiceAccount", name) in seen, f"{who}: ServiceAccount {name} not rendered")
        check.expect(pod["spec"].get("automountServiceAccountToken") is False,
                     f"{who}: the API token should not be mounted")

    return report(check)


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


def check_identity(objs, deploy, container, flags, identity, args, check):
    """The scheduler's id: a Secret -> env (secretKeyRef) -> --scheduler_id=$(ENV)."""
    key = identity["key"]
    existing = identity["existingSecret"]
    secret_name = existing or f"{deploy['metadata']['name']}-id"[:63].rstrip("-")
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
    check.expect(len(secrets) == 1 and secrets[0]["metadata"]["name"] == secret_name,
                 f"expected one Secret {secret_name} holding the scheduler's id, found "
                 f"{[s['metadata']['name'] for s in secrets]}")
    if len(secrets) != 1:
        return
    secret = secrets[0]
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
