#!/usr/bin/python3
"""Tests the testers: breaks a good rendering (or the dashboard) in ways the checkers must
catch, one mutation at a time, and fails if a checker still passes.

    self_test.py manifests GOOD.yaml --chart DIR [-f VALUES]... --namespace NS
    self_test.py dashboard GOOD.json [--metrics-doc docs/metrics.md]
"""

import argparse
import base64
import copy
import json
import os
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))


def first(objs, kind):
    return next(o for o in objs if o["kind"] == kind)


def worker_container(objs):
    return first(objs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def scheduler_container(objs):
    return first(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def worker_policy(objs):
    sts_labels = first(objs, "StatefulSet")["spec"]["selector"]["matchLabels"]
    return next(o for o in objs if o["kind"] == "NetworkPolicy"
                and o["spec"]["podSelector"]["matchLabels"] == sts_labels)


def set_arg(container, flag, value):
    container["args"] = [f"--{flag}={value}" if a.startswith(f"--{flag}=") else a
                         for a in container["args"]]


def m_np_from_other_pods(objs):
    peer = worker_policy(objs)["spec"]["ingress"][0]["from"][0]
    peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] = "client"


def m_np_open_to_all(objs):
    del worker_policy(objs)["spec"]["ingress"][0]["from"]


def m_np_namespace_peer(objs):
    worker_policy(objs)["spec"]["ingress"][0]["from"].append(
        {"namespaceSelector": {"matchLabels": {"team": "other"}}})


def m_no_gpu_limit(objs):
    worker_container(objs)["resources"]["limits"].pop("nvidia.com/gpu", None)


def m_two_gpus(objs):
    worker_container(objs)["resources"].setdefault("requests", {})["nvidia.com/gpu"] = 2


def m_gpu_in_cpu_mode(objs):
    worker_container(objs)["resources"].setdefault("limits", {})["nvidia.com/gpu"] = 1


def m_wrong_worker_name(objs):
    c = scheduler_container(objs)
    workers = next(a for a in c["args"] if a.startswith("--workers="))
    set_arg(c, "workers", workers.split("=", 1)[1].replace("-worker-0.", "-workers-0."))


def m_missing_rank(objs):
    first(objs, "StatefulSet")["spec"]["replicas"] += 1


def m_short_grace(objs):
    drain = next(a for a in scheduler_container(objs)["args"] if a.startswith("--drain_timeout_s="))
    pod = first(objs, "Deployment")["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = int(drain.split("=", 1)[1])


def m_http_probe(objs):
    worker_container(objs)["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 9401}}


def m_not_headless(objs):
    for svc in objs:
        if svc["kind"] == "Service" and svc["spec"].get("clusterIP") == "None":
            del svc["spec"]["clusterIP"]


def m_sm_port(objs):
    first(objs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "http"


def m_missing_flag(objs):
    c = scheduler_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--max_queue=")]


def m_float_flag(objs):
    set_arg(scheduler_container(objs), "kv_cache_bytes", "8.589934592e+09")


def m_wrong_backend(objs):
    c = worker_container(objs)
    backend = next(a for a in c["args"] if a.startswith("--backend="))
    set_arg(c, "backend", "cpu" if backend.endswith("cuda") else "cuda")


def id_env(objs):
    return next(e for e in scheduler_container(objs)["env"] if e["name"] == "CONVEYOR_SCHEDULER_ID")


def m_no_secret(objs):
    objs.remove(first(objs, "Secret"))


def m_id_in_spec(objs):
    e = id_env(objs)
    del e["valueFrom"]
    e["value"] = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def m_id_literal_arg(objs):
    set_arg(scheduler_container(objs), "scheduler_id", "scheduler-0")


def m_id_other_key(objs):
    id_env(objs)["valueFrom"]["secretKeyRef"]["key"] = "token"


def m_id_optional(objs):
    id_env(objs)["valueFrom"]["secretKeyRef"]["optional"] = True


def m_id_env_twice(objs):
    scheduler_container(objs)["env"].append({"name": "CONVEYOR_SCHEDULER_ID", "value": "x"})


def m_short_id(objs):
    secret = first(objs, "Secret")
    key = next(iter(secret["data"]))
    secret["data"][key] = base64.b64encode(b"conveyor").decode()


def m_secret_despite_existing(objs):
    objs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                 "metadata": dict(first(objs, "Deployment")["metadata"], name="extra-id"),
                 "data": {"scheduler-id": base64.b64encode(b"A" * 32).decode()}})


def m_no_binding_lease(objs):
    c = worker_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--binding_lease_s=")]


def m_short_binding_lease(objs):
    set_arg(worker_container(objs), "binding_lease_s", "2")


def m_liveness_within_recovery(objs):
    probe = scheduler_container(objs)["livenessProbe"]
    probe["periodSeconds"], probe["failureThreshold"] = 10, 6


def volume(pod_spec, name):
    return next(v for v in pod_spec["volumes"] if v["name"] == name)


def sched_pod_spec(objs):
    return first(objs, "Deployment")["spec"]["template"]["spec"]


def worker_pod_spec(objs):
    return first(objs, "StatefulSet")["spec"]["template"]["spec"]


def m_probe_on_tls_port(objs):
    c = scheduler_container(objs)
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    c["livenessProbe"]["grpc"]["port"] = port


def m_worker_probe_on_tls_port(objs):
    c = worker_container(objs)
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "grpc")
    c["readinessProbe"]["grpc"]["port"] = port


def m_cert_from_other_secret(objs):
    volume(sched_pod_spec(objs), "client-api-tls")["secret"]["secretName"] = "someone-else"


def m_cert_wrong_path(objs):
    set_arg(scheduler_container(objs), "tls_cert_file", "/etc/conveyor/tls/tls.crt")


def m_key_world_readable(objs):
    volume(sched_pod_spec(objs), "client-api-tls")["secret"]["defaultMode"] = 0o644


def m_secret_mount_writable(objs):
    for m in worker_container(objs)["volumeMounts"]:
        if m["name"] == "internal-tls":
            m["readOnly"] = False


def m_worker_ca_wrong_key(objs):
    for item in volume(worker_pod_spec(objs), "internal-tls")["secret"]["items"]:
        if item["path"] == "ca.crt":
            item["key"] = "tls.crt"


def m_worker_no_ca(objs):
    c = worker_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--tls_ca_file=")]


def m_scheduler_no_worker_ca(objs):
    c = scheduler_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--worker_tls_ca_file=")]


def m_no_tokens_file(objs):
    c = scheduler_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--auth_tokens_file=")]


def m_tokens_wrong_key(objs):
    volume(sched_pod_spec(objs), "auth-tokens")["secret"]["items"][0]["key"] = "tokens-old"


def m_short_collective_host(objs):
    set_arg(worker_container(objs), "collective_host", "$(POD_NAME)")


def m_reflection_flipped(objs):
    c = scheduler_container(objs)
    value = next(a for a in c["args"] if a.startswith("--enable_reflection="))
    set_arg(c, "enable_reflection", "false" if value.endswith("true") else "true")


def m_health_port_open(objs):
    worker_policy(objs)["spec"]["ingress"].append({"ports": [{"port": next(
        p["containerPort"] for p in worker_container(objs)["ports"] if p["name"] == "health")}]})


# name: (mutation, applies to: np/sm/gpu/cpu/secret/existing renderings or all, text the
# failure must contain); secret: the chart made the identity Secret, existing: it did not.
MANIFEST_MUTATIONS = {
    "worker NetworkPolicy admits other pods": (m_np_from_other_pods, "np", "is open to"),
    "worker NetworkPolicy open to all": (m_np_open_to_all, "np", "any source"),
    "worker NetworkPolicy admits a namespace": (m_np_namespace_peer, "np", "is open to"),
    "no GPU limit": (m_no_gpu_limit, "gpu", "limits.nvidia.com/gpu"),
    "two GPUs per rank": (m_two_gpus, "gpu", "requests.nvidia.com/gpu"),
    "GPU requested in CPU mode": (m_gpu_in_cpu_mode, "cpu", "must not request a GPU"),
    "--workers names the wrong service": (m_wrong_worker_name, None, "--workers="),
    "replicas != TP": (m_missing_rank, None, "replicas"),
    "grace period <= drain": (m_short_grace, None, "terminationGracePeriodSeconds"),
    "HTTP probe instead of gRPC": (m_http_probe, None, "native gRPC probe"),
    "worker Service not headless": (m_not_headless, None, "headless"),
    "ServiceMonitor on a missing port": (m_sm_port, "sm", "endpoint port"),
    "scheduler flag missing": (m_missing_flag, None, "scheduler flags"),
    "flag rendered as a float": (m_float_flag, None, "not an integer"),
    "wrong worker backend": (m_wrong_backend, None, "--backend="),
    "identity Secret missing": (m_no_secret, "secret", "holding the scheduler's id"),
    "scheduler id written into the pod spec": (m_id_in_spec, None, "must come from secretKeyRef"),
    "--scheduler_id not from the env": (m_id_literal_arg, None, "--scheduler_id="),
    "id from another Secret key": (m_id_other_key, None, "must come from secretKeyRef"),
    "identity Secret optional": (m_id_optional, None, "not optional"),
    "id env set twice": (m_id_env_twice, None, "env names repeat"),
    "id not 32 random characters": (m_short_id, "secret", "alphanumeric id"),
    "Secret rendered despite existingSecret": (m_secret_despite_existing, "existing",
                                               "must not create a Secret"),
    "worker without --binding_lease_s": (m_no_binding_lease, None, "worker flags"),
    "binding lease within the idle checks": (m_short_binding_lease, None, "must exceed the scheduler's idle"),
    "liveness fails mid-recovery": (m_liveness_within_recovery, None, "restart the scheduler mid-recovery"),
    "--collective_host not the stable name": (m_short_collective_host, None, "--collective_host="),
    "--enable_reflection not from the value": (m_reflection_flipped, None, "--enable_reflection="),
    # Security (tls-client: client API TLS on; tls-internal: mTLS to the workers; auth: tokens).
    "scheduler probe on its TLS port": (m_probe_on_tls_port, "tls-client", "native gRPC probe"),
    "worker probe on its mTLS port": (m_worker_probe_on_tls_port, "tls-internal", "native gRPC probe"),
    "client cert from another Secret": (m_cert_from_other_secret, "tls-client", "is not a file of Secret"),
    "--tls_cert_file not in the mount": (m_cert_wrong_path, "tls-client", "is not a file of Secret"),
    "key readable by others": (m_key_world_readable, "tls-client", "defaultMode"),
    "Secret mounted writable": (m_secret_mount_writable, "tls-internal", "not read-only"),
    "worker CA from the wrong key": (m_worker_ca_wrong_key, "tls-internal", "is not a file of Secret"),
    "worker without --tls_ca_file": (m_worker_no_ca, "tls-internal", "worker flags"),
    "scheduler without --worker_tls_ca_file": (m_scheduler_no_worker_ca, "tls-internal", "scheduler flags"),
    "no --auth_tokens_file": (m_no_tokens_file, "auth", "scheduler flags"),
    "tokens from the wrong key": (m_tokens_wrong_key, "auth", "is not a file of Secret"),
    "worker health port open to all": (m_health_port_open, "np-tls-internal", "health port is open to"),
}


def d_unknown_metric(d):
    t = d["panels"][1]["targets"][0]
    t["expr"] = t["expr"].replace("conveyor_generated_tokens_total", "conveyor_output_tokens_total")


def d_histogram_without_suffix(d):
    for p in d["panels"]:
        for t in p.get("targets", []):
            t["expr"] = t["expr"].replace("conveyor_time_to_first_token_seconds_bucket",
                                          "conveyor_time_to_first_token_seconds")


def d_counter_as_histogram(d):
    d["panels"][1]["targets"][0]["expr"] = (
        "histogram_quantile(0.5, sum by (le) (rate(conveyor_generated_tokens_total_bucket[5m])))")


def d_policy_on_worker_metric(d):
    for p in d["panels"]:
        for t in p.get("targets", []):
            t["expr"] = t["expr"].replace('conveyor_worker_steps_total{model=~"$model"}',
                                          'conveyor_worker_steps_total{model=~"$model", policy=~"$policy"}')


def d_group_by_missing_label(d):
    for p in d["panels"]:
        for t in p.get("targets", []):
            t["expr"] = t["expr"].replace("sum by (reason)", "sum by (status)")


def d_fixed_datasource(d):
    d["panels"][1]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}


def d_no_policy_variable(d):
    d["templating"]["list"] = [v for v in d["templating"]["list"] if v["name"] != "policy"]


def d_metric_not_shown(d):
    def keep(p):
        return not any("conveyor_preemptions_total" in t["expr"] for t in p.get("targets", []))
    d["panels"] = [p for p in d["panels"] if keep(p)]


DASHBOARD_MUTATIONS = {
    "unknown metric": (d_unknown_metric, "conveyor_output_tokens_total is not exported"),
    "histogram without _bucket": (d_histogram_without_suffix,
                                  "conveyor_time_to_first_token_seconds is not exported"),
    "counter used as histogram": (d_counter_as_histogram,
                                  "conveyor_generated_tokens_total_bucket is not exported"),
    "policy label on a worker metric": (d_policy_on_worker_metric, "has no label 'policy'"),
    "grouping by a label nobody has": (d_group_by_missing_label, "groups by 'status'"),
    "fixed data source": (d_fixed_datasource, "does not use the ${datasource} variable"),
    "no policy variable": (d_no_policy_variable, "no `policy` query variable"),
    "documented metric on no panel": (d_metric_not_shown, "conveyor_preemptions_total"),
}


def fails(cmd, expected=None):
    """True if the command fails (and, given `expected`, says so in its output)."""
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return run.returncode != 0 and (expected is None or expected in run.stdout)


def run_manifests(args):
    with open(args.good, encoding="utf-8") as f:
        good = [d for d in yaml.safe_load_all(f) if d]
    kinds = {o["kind"] for o in good}
    cpu = any("--backend=cpu" in a for a in worker_container(good)["args"])
    sched_args, worker_args = scheduler_container(good)["args"], worker_container(good)["args"]
    features = set()
    if any(a.startswith("--tls_cert_file=") for a in sched_args):
        features.add("tls-client")
    if any(a.startswith("--tls_cert_file=") for a in worker_args):
        features.add("tls-internal")
        if "NetworkPolicy" in kinds:
            features.add("np-tls-internal")
    if any(a.startswith("--auth_tokens_file=") for a in sched_args):
        features.add("auth")
    checker = [sys.executable, os.path.join(HERE, "check_manifests.py"), "--chart", args.chart,
               "--namespace", args.namespace] + [x for v in args.values for x in ("-f", v)]
    if fails(checker + [args.good]):
        print(f"MISSED the good rendering {args.good} already fails the checker")
        return 1
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (mutate, needs, expected) in MANIFEST_MUTATIONS.items():
            if ((needs == "np" and "NetworkPolicy" not in kinds) or
                    (needs == "sm" and "ServiceMonitor" not in kinds) or
                    (needs == "secret" and "Secret" not in kinds) or
                    (needs == "existing" and "Secret" in kinds) or
                    (needs == "gpu" and cpu) or (needs == "cpu" and not cpu) or
                    (needs in ("tls-client", "tls-internal", "np-tls-internal", "auth") and
                     needs not in features)):
                continue
            objs = copy.deepcopy(good)
            mutate(objs)
            path = os.path.join(tmp, "mutated.yaml")
            with open(path, "w", encoding="utf-8") as f:
                yaml.safe_dump_all(objs, f)
            caught = fails(checker + [path], expected)
            missed += not caught
            print(f"{'caught' if caught else 'MISSED'}: {name}")
    return 1 if missed else 0


def run_dashboard(args):
    with open(args.good, encoding="utf-8") as f:
        good = json.load(f)
    checker = [sys.executable, os.path.join(HERE, "check_dashboard.py"),
               "--metrics-doc", args.metrics_doc]
    if fails(checker + [args.good]):
        print(f"MISSED the good dashboard {args.good} already fails the checker")
        return 1
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (mutate, expected) in DASHBOARD_MUTATIONS.items():
            d = copy.deepcopy(good)
            mutate(d)
            path = os.path.join(tmp, "mutated.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(d, f)
            caught = fails(checker + [path], expected)
            missed += not caught
            print(f"{'caught' if caught else 'MISSED'}: {name}")
        path = os.path.join(tmp, "broken.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(good)[:-1])
        caught = fails(checker + [path])
        missed += not caught
        print(f"{'caught' if caught else 'MISSED'}: truncated JSON")
    return 1 if missed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("manifests")
    m.add_argument("good")
    m.add_argument("--chart", required=True)
    m.add_argument("-f", dest="values", action="append", default=[])
    m.add_argument("--namespace", required=True)
    d = sub.add_parser("dashboard")
    d.add_argument("good")
    d.add_argument("--metrics-doc", default="docs/metrics.md")
    args = parser.parse_args()
    return run_manifests(args) if args.what == "manifests" else run_dashboard(args)


if __name__ == "__main__":
    sys.exit(main())
