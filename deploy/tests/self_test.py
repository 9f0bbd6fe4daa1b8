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


GROUP_LABEL = "conveyor.ai/replica-group"


def first(objs, kind):
    return next(o for o in objs if o["kind"] == kind)


def component(obj):
    return (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component")


def of(objs, kind, who):
    """The objects of one kind and component, in rendering (group) order."""
    return [o for o in objs if o["kind"] == kind and component(o) == who]


def scheduler_deployment(objs, group=0):
    return of(objs, "Deployment", "scheduler")[group]


def worker_container(objs):
    return first(objs, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def scheduler_container(objs, group=0):
    return scheduler_deployment(objs, group)["spec"]["template"]["spec"]["containers"][0]


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
    pod = scheduler_deployment(objs)["spec"]["template"]["spec"]
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


def m_other_served_name(objs):
    # One replica behind the router serving another name than the rest.
    set_arg(scheduler_container(objs, len(of(objs, "Deployment", "scheduler")) - 1),
            "served_model_name", "another-model")


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
                 "metadata": dict(scheduler_deployment(objs)["metadata"], name="extra-id"),
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
    return scheduler_deployment(objs)["spec"]["template"]["spec"]


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


# --- Model replicas (groups), router, InferencePool.

def group_objects(objs, kind, group):
    return next(o for o in objs if o["kind"] == kind and
                (o["spec"]["template"]["metadata"]["labels"] if kind in ("Deployment", "StatefulSet")
                 else o["spec"].get("selector") or {}).get(GROUP_LABEL) == str(group))


def arg_of(container, flag):
    return next(a for a in container["args"] if a.startswith(f"--{flag}=")).split("=", 1)[1]


def m_workers_of_other_group(objs):
    set_arg(scheduler_container(objs, 1), "workers", arg_of(scheduler_container(objs, 0), "workers"))


def id_ref(objs, group):
    return next(e for e in scheduler_container(objs, group)["env"]
                if e["name"] == "CONVEYOR_SCHEDULER_ID")["valueFrom"]["secretKeyRef"]


def m_shared_identity(objs):
    id_ref(objs, 1).update(id_ref(objs, 0))


def m_same_id_twice(objs):
    secrets = [o for o in objs if o["kind"] == "Secret"]
    secrets[1]["data"] = dict(secrets[0]["data"])


def m_sts_selector_without_group(objs):
    del group_objects(objs, "StatefulSet", 1)["spec"]["selector"]["matchLabels"][GROUP_LABEL]


def m_one_group_short(objs):
    objs.remove([o for o in objs if o["kind"] == "StatefulSet"][-1])


def m_worker_np_all_schedulers(objs):
    del worker_policy(objs)["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][GROUP_LABEL]


def m_worker_np_all_groups(objs):
    del worker_policy(objs)["spec"]["podSelector"]["matchLabels"][GROUP_LABEL]


def m_client_service_one_group(objs):
    svc = next(o for o in of(objs, "Service", "scheduler") if o["spec"].get("clusterIP") != "None")
    svc["spec"]["selector"][GROUP_LABEL] = "0"


def m_sm_without_group(objs):
    for ep in first(objs, "ServiceMonitor")["spec"]["endpoints"]:
        ep["relabelings"] = [r for r in ep.get("relabelings", []) if "replica" not in str(r)]


def m_single_group_labelled(objs):
    scheduler_deployment(objs)["spec"]["template"]["metadata"]["labels"][GROUP_LABEL] = "0"


def router_container(objs):
    return of(objs, "Deployment", "router")[0]["spec"]["template"]["spec"]["containers"][0]


def replace_word(container, old, new):
    container["args"] = [new if a == old else a for a in container["args"]]


def m_router_selects_workers(objs):
    replace_word(router_container(objs), "app.kubernetes.io/component=scheduler",
                 "app.kubernetes.io/component=worker")


def m_router_selector_any_release(objs):
    c = router_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("app.kubernetes.io/instance=")]


def m_router_grpc_port(objs):
    set_arg(router_container(objs), "service-discovery-port", arg_of(scheduler_container(objs), "port"))


def m_router_other_namespace(objs):
    set_arg(router_container(objs), "service-discovery-namespace", "default-other")


def m_router_kv_aware(objs):
    set_arg(router_container(objs), "policy", "kv_aware")


def m_router_static_workers(objs):
    c = router_container(objs)
    c["args"] = [a for a in c["args"] if a != "--service-discovery"]


def m_sglang_without_launch(objs):
    c = router_container(objs)
    c["args"] = [a for a in c["args"] if a != "launch"]


def m_router_service_schedulers(objs):
    of(objs, "Service", "router")[0]["spec"]["selector"]["app.kubernetes.io/component"] = "scheduler"


def m_role_deletes_pods(objs):
    first(objs, "Role")["rules"][0]["verbs"].append("delete")


def m_cluster_role(objs):
    role = dict(first(objs, "Role"), kind="ClusterRole")
    objs.append(role)


def m_no_router_policy(objs):
    objs.remove(of(objs, "NetworkPolicy", "router")[0])


def scheduler_policy(objs):
    return next(o for o in of(objs, "NetworkPolicy", "scheduler")
                if GROUP_LABEL not in o["spec"]["podSelector"]["matchLabels"])


def m_http_closed_to_router(objs):
    np = scheduler_policy(objs)
    np["spec"]["ingress"] = [r for r in np["spec"]["ingress"] if "router" not in str(r.get("from"))]


def epp_container(objs):
    return of(objs, "Deployment", "endpoint-picker")[0]["spec"]["template"]["spec"]["containers"][0]


def m_epp_vllm_kv_metric(objs):
    set_arg(epp_container(objs), "kv-cache-usage-percentage-metric", "vllm:kv_cache_usage_perc")


def m_epp_lora_default(objs):
    c = epp_container(objs)
    c["args"] = [a for a in c["args"] if not a.startswith("--lora-info-metric=")]


def m_epp_pool_name(objs):
    set_arg(epp_container(objs), "pool-name", "another-pool")


def m_epp_config_missing(objs):
    set_arg(epp_container(objs), "config-file", "/config/missing.yaml")


def pool_spec(objs):
    return first(objs, "InferencePool")["spec"]


def m_pool_grpc_port(objs):
    pool_spec(objs)["targetPorts"] = [{"number": int(arg_of(scheduler_container(objs), "port"))}]


def m_pool_alpha_api(objs):
    first(objs, "InferencePool")["apiVersion"] = "inference.networking.x-k8s.io/v1alpha2"


def m_pool_selects_workers(objs):
    pool_spec(objs)["selector"]["matchLabels"]["app.kubernetes.io/component"] = "worker"


def m_pool_wrong_picker(objs):
    pool_spec(objs)["endpointPickerRef"]["name"] = "some-other-epp"


def m_pool_picker_metrics_port(objs):
    pool_spec(objs)["endpointPickerRef"]["port"]["number"] = 9090


def m_epp_reads_secrets(objs):
    role = next(o for o in of(objs, "Role", "endpoint-picker"))
    role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})


# name: (mutation, applies to: np/sm/gpu/cpu/secret/existing renderings or all, text the
# failure must contain); secret: the chart made the identity Secret, existing: it did not.
# groups: several model replicas; single: one; router, sglang, pool: those are on;
# np-router: the schedulers' HTTP port admits the router by its pod labels.
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
    "a replica serves another model name": (m_other_served_name, "served",
                                            "--served_model_name"),
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
    # Model replicas.
    "a scheduler drives another group's workers": (m_workers_of_other_group, "groups",
                                                   "group 1's scheduler --workers lists group 0's ranks"),
    "two groups present one identity": (m_shared_identity, "groups", "groups share a scheduler identity"),
    "two groups' Secrets hold one id": (m_same_id_twice, "groups-secret", "hold the same id"),
    "a StatefulSet selects every group": (m_sts_selector_without_group, "groups",
                                          f"carry {GROUP_LABEL}"),
    "one group short": (m_one_group_short, "groups", "worker StatefulSets (replicas)"),
    "worker port open to every group's scheduler": (m_worker_np_all_schedulers, "np-groups",
                                                    "open to another group's pods"),
    "worker policy covers every group": (m_worker_np_all_groups, "np-groups",
                                         "also selects another group's workers"),
    "scheduler Service reaches one group": (m_client_service_one_group, "groups",
                                            "does not select the scheduler pods (group 1)"),
    "ServiceMonitor drops the group": (m_sm_without_group, "sm-groups", "does not keep the replica group"),
    "one replica gets a group label": (m_single_group_labelled, "single", f"carries no {GROUP_LABEL}"),
    # Router.
    "router discovers workers": (m_router_selects_workers, "router",
                                 "does not select every group's scheduler pods"),
    "router discovers any release's schedulers": (m_router_selector_any_release, "router",
                                                  "must name this release's instance"),
    "router calls the gRPC port": (m_router_grpc_port, "router", "--service-discovery-port="),
    "router watches another namespace": (m_router_other_namespace, "router",
                                         "--service-discovery-namespace="),
    "router policy Conveyor cannot serve": (m_router_kv_aware, "router", "--policy=kv_aware"),
    "router without service discovery": (m_router_static_workers, "router", "router flags"),
    "sglang-router without launch": (m_sglang_without_launch, "sglang", "router arguments start with"),
    "router Service selects the schedulers": (m_router_service_schedulers, "router",
                                              "router Service does not select exactly the router pods"),
    "Role may delete pods": (m_role_deletes_pods, "rbac", "grants more than get/list/watch"),
    "cluster-wide Role": (m_cluster_role, "rbac", "cluster-wide RBAC"),
    "no router NetworkPolicy": (m_no_router_policy, "np-router-any", "NetworkPolicy selecting the router pods"),
    "schedulers' HTTP port closed to the router": (m_http_closed_to_router, "np-router",
                                                   "not open to the router pods"),
    # InferencePool and endpoint picker.
    "picker reads vLLM's KV metric": (m_epp_vllm_kv_metric, "pool", "endpoint picker metric flags"),
    "picker scrapes LoRA info": (m_epp_lora_default, "pool", "endpoint picker metric flags"),
    "picker of another pool": (m_epp_pool_name, "pool", "--pool-name"),
    "picker config not mounted": (m_epp_config_missing, "pool", "--config-file=/config/missing.yaml"),
    "pool targets the gRPC port": (m_pool_grpc_port, "pool", "targetPorts"),
    "pool on the alpha API": (m_pool_alpha_api, "pool", "InferencePool apiVersion"),
    "pool selects workers": (m_pool_selects_workers, "pool", "InferencePool selector"),
    "pool names another picker": (m_pool_wrong_picker, "pool", "endpointPickerRef"),
    "pool's picker port is its metrics": (m_pool_picker_metrics_port, "pool", "http2 (ext-proc) port"),
    "picker may read Secrets": (m_epp_reads_secrets, "pool", "expected exactly"),
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
    if any(a.startswith("--served_model_name=") for a in sched_args):
        features.add("served")
    grouped = any(GROUP_LABEL in o["spec"]["template"]["metadata"]["labels"]
                  for o in good if o["kind"] == "StatefulSet")
    features.add("groups" if grouped else "single")
    if grouped and "Secret" in kinds:
        features.add("groups-secret")
    if grouped and "NetworkPolicy" in kinds:
        features.add("np-groups")
    if grouped and "ServiceMonitor" in kinds:
        features.add("sm-groups")
    if of(good, "Deployment", "router"):
        features.add("router")
        if router_container(good)["args"][0] == "launch":
            features.add("sglang")
        if "NetworkPolicy" in kinds:
            features.add("np-router-any")
            if "router" in str(scheduler_policy(good)["spec"]["ingress"]):
                features.add("np-router")
    if "InferencePool" in kinds:
        features.add("pool")
    if "Role" in kinds:
        features.add("rbac")
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
                    (needs in ("tls-client", "tls-internal", "np-tls-internal", "auth", "groups",
                               "single", "groups-secret", "np-groups", "sm-groups", "router",
                               "sglang", "np-router-any", "np-router", "pool", "rbac", "served") and
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
