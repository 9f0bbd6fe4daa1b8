#!/usr/bin/env python3
"""Generates conveyor-dashboard.json, the Grafana dashboard for Conveyor's metrics
(docs/metrics.md). Edit this file, not the JSON, then run:

    python3 deploy/grafana/gen_dashboard.py > deploy/grafana/conveyor-dashboard.json

deploy/tests/run_chart_tests.sh fails when the JSON is out of date.

The data source is a dashboard variable (`datasource`), so the JSON imports into any
Grafana with a Prometheus data source; `model` and `policy` select the scheduler series
(worker series carry `model` and `rank`, no `policy`).
"""

import json
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
SCHED = 'model=~"$model", policy=~"$policy"'
WORKER = 'model=~"$model"'
RATE = "$__rate_interval"


def rate(metric, sel=SCHED):
    return f"rate({metric}{{{sel}}}[{RATE}])"


def quantile(q, histogram, sel=SCHED, by=""):
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) ({rate(histogram + '_bucket', sel)}))"


def ratio(numerator, denominator, by=""):
    group = f" by ({by}) " if by else ""
    return f"sum{group}({numerator}) / sum{group}({denominator})"


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "range": True, "refId": ref}


class Layout:
    """Places panels left to right in rows of 24 grid units."""

    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_height = 0

    def _place(self, panel, w, h):
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.row_height
            self.row_height = 0
        panel["id"] = self.next_id
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.panels.append(panel)

    def row(self, title):
        if self.x:
            self.x, self.y = 0, self.y + self.row_height
        self.row_height = 0
        self._place({"type": "row", "title": title, "collapsed": False, "panels": []}, 24, 1)
        self.x, self.y, self.row_height = 0, self.y + 1, 0

    def panel(self, kind, title, description, targets, unit, w, h, **options):
        refs = "ABCDEFGH"
        panel = {
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DS,
            "targets": [target(expr, legend, refs[i]) for i, (expr, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
        }
        if kind == "timeseries":
            panel["fieldConfig"]["defaults"]["custom"] = {"fillOpacity": 10, "lineWidth": 1,
                                                         "showPoints": "never"}
            panel["options"] = {"legend": {"displayMode": "list", "placement": "bottom",
                                           "showLegend": True},
                                "tooltip": {"mode": "multi", "sort": "desc"}}
        elif kind in ("stat", "gauge"):
            panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                                  "values": False}}
        for key in ("min", "max", "decimals"):
            if key in options:
                panel["fieldConfig"]["defaults"][key] = options[key]
        if "thresholds" in options:
            panel["fieldConfig"]["defaults"]["thresholds"] = {
                "mode": "absolute",
                "steps": [{"color": color, "value": value} for value, color in options["thresholds"]],
            }
        self._place(panel, w, h)


def percentiles(histogram, sel=SCHED, qs=(0.5, 0.9, 0.99), by="", legend_by=""):
    suffix = f" {{{{{legend_by}}}}}" if legend_by else ""
    return [(quantile(q, histogram, sel, by), f"p{int(round(q * 100))}{suffix}") for q in qs]


def build():
    g = Layout()
    tok_s = "suffix: tok/s"
    generated = rate("conveyor_generated_tokens_total")
    kv_ratio = ratio("conveyor_kv_blocks_used{" + SCHED + "}",
                     "conveyor_kv_blocks_capacity{" + SCHED + "}")

    g.row("Overview")
    g.panel("stat", "Output tokens/s", "Tokens streamed to clients per second.",
            [(f"sum({generated})", "output")], tok_s, 4, 4)
    g.panel("stat", "Requests/s", "Finished requests per second, any reason.",
            [(f"sum({rate('conveyor_requests_finished_total')})", "finished")], "reqps", 4, 4)
    g.panel("stat", "Running", "Requests holding KV blocks.",
            [(f"sum(conveyor_requests_running{{{SCHED}}})", "running")], "short", 4, 4)
    g.panel("stat", "Waiting", "Requests queued for admission.",
            [(f"sum(conveyor_requests_waiting{{{SCHED}}})", "waiting")], "short", 4, 4)
    g.panel("gauge", "KV cache used", "KV blocks referenced by live requests / blocks held.",
            [(kv_ratio, "used")], "percentunit", 4, 4, min=0, max=1,
            thresholds=[(None, "green"), (0.8, "orange"), (0.95, "red")])
    g.panel("stat", "Workers ready", "Worker ranks initialised and answering.",
            [(f"sum(conveyor_workers_ready{{{SCHED}}})", "ready")], "short", 4, 4,
            thresholds=[(None, "red"), (1, "green")])

    g.row("Throughput")
    g.panel("timeseries", "Output and prompt tokens/s",
            "Generated tokens streamed; prompt tokens admitted; prompt tokens actually "
            "computed (admitted minus prefix-cache hits); tokens sampled for requests that "
            "had already ended (with two steps in flight, a request that stops is computed "
            "once more).",
            [(f"sum({generated})", "output (generated)"),
             (f"sum({rate('conveyor_prompt_tokens_total')})", "prompt (admitted)"),
             (f"sum({rate('conveyor_prefill_tokens_total')})", "prompt (computed)"),
             (f"sum({rate('conveyor_discarded_tokens_total')})", "discarded")],
            tok_s, 12, 8)
    g.panel("timeseries", "Requests/s by finish reason",
            "Finished requests by reason, and rejected requests by gRPC code.",
            [(f"sum by (reason) ({rate('conveyor_requests_finished_total')})", "{{reason}}"),
             (f"sum by (code) ({rate('conveyor_requests_rejected_total')})", "rejected {{code}}")],
            "reqps", 12, 8)

    g.row("HTTP front")
    g.panel("timeseries", "HTTP connections",
            "Connections open on the OpenAI-compatible HTTP port. Idle ones cost memory, not "
            "threads; at --http_max_connections the longest idle one makes room.",
            [(f"sum(conveyor_http_connections{{{SCHED}}})", "open")], "short", 12, 8)
    g.panel("timeseries", "HTTP refusals/s by reason",
            "Connections and requests the HTTP port refused before they reached the API: "
            "timeouts, oversized headers or bodies, the connection cap, readers too slow "
            "for their stream (docs/http-api.md).",
            [(f"sum by (reason) ({rate('conveyor_http_refused_total')})", "{{reason}}")],
            "reqps", 12, 8)

    g.row("Latency")
    g.panel("timeseries", "Time to first token",
            "Arrival of a request to its first streamed token.",
            percentiles("conveyor_time_to_first_token_seconds"), "s", 8, 8)
    g.panel("timeseries", "Inter-token latency",
            "Gap between consecutive tokens of one request.",
            percentiles("conveyor_inter_token_latency_seconds"), "s", 8, 8)
    g.panel("timeseries", "End-to-end latency", "Arrival to the final message.",
            percentiles("conveyor_e2e_request_latency_seconds"), "s", 8, 8)
    g.panel("timeseries", "Queue time", "Arrival to first scheduling.",
            percentiles("conveyor_request_queue_time_seconds"), "s", 12, 8)
    g.panel("timeseries", "Step duration",
            "One step as the scheduler loop sees it: planning (unless it overlapped the "
            "step before), worker round trip, streaming.",
            percentiles("conveyor_step_duration_seconds", qs=(0.5, 0.99)), "s", 12, 8)

    g.row("Batching")
    g.panel("timeseries", "Running and waiting requests",
            "Requests holding KV blocks, and requests queued for admission.",
            [(f"sum(conveyor_requests_running{{{SCHED}}})", "running"),
             (f"sum(conveyor_requests_waiting{{{SCHED}}})", "waiting")], "short", 6, 8)
    g.panel("timeseries", "Tokens per step", "Tokens computed per step (prefill + decode).",
            [(ratio(rate("conveyor_step_tokens_sum"), rate("conveyor_step_tokens_count")), "mean")]
            + percentiles("conveyor_step_tokens", qs=(0.5, 0.99)), "short", 6, 8)
    g.panel("timeseries", "Bubble ratio",
            "Batch slot-steps held by already finished members / all slot-steps "
            "(static and dynamic batching; continuous batching has no fixed width).",
            [(ratio(rate("conveyor_batch_slot_steps_wasted_total"),
                    rate("conveyor_batch_slot_steps_total"), by="policy"), "{{policy}}")],
            "percentunit", 6, 8, min=0, max=1)
    g.panel("timeseries", "Request sizes", "Prompt and generated tokens per finished request.",
            [(quantile(q, hist), f"{what} p{int(q * 100)}")
             for what, hist in (("prompt", "conveyor_request_prompt_tokens"),
                                ("generated", "conveyor_request_generated_tokens"))
             for q in (0.5, 0.9)], "short", 6, 8)

    g.row("Speculative decoding")
    g.panel("timeseries", "Draft tokens/s",
            "Draft tokens proposed and verified, and those kept (each a decode step saved) "
            "(docs/speculative-decoding.md).",
            [(f"sum({rate('conveyor_spec_draft_tokens_total')})", "proposed"),
             (f"sum({rate('conveyor_spec_accepted_tokens_total')})", "kept")], "short", 8, 8)
    g.panel("timeseries", "Mean accepted length",
            "Draft tokens kept per sequence verified (+1 is the tokens a speculating "
            "sequence gets per step).",
            [(ratio(rate("conveyor_spec_accepted_tokens_total"),
                    rate("conveyor_spec_verifications_total")), "kept per verification")],
            "short", 8, 8)
    g.panel("timeseries", "Acceptance rate by draft position",
            "Drafts kept / proposed at each position after the last known token.",
            [(ratio(rate("conveyor_spec_position_accepted_total"),
                    rate("conveyor_spec_position_drafts_total"), by="position"),
              "position {{position}}")], "percentunit", 8, 8, min=0, max=1)

    g.row("KV cache")
    g.panel("timeseries", "KV blocks", "Blocks referenced by live requests, and blocks held.",
            [(f"sum(conveyor_kv_blocks_used{{{SCHED}}})", "used"),
             (f"sum(conveyor_kv_blocks_capacity{{{SCHED}}})", "total")], "short", 6, 8)
    g.panel("timeseries", "KV usage per scheduler",
            "conveyor_kv_cache_usage_ratio: each replica's used / held blocks, the KV "
            "utilisation routers' endpoint pickers read (docs/scaling.md).",
            [(f"conveyor_kv_cache_usage_ratio{{{SCHED}}}", "{{instance}}")], "percentunit", 6, 8,
            min=0, max=1)
    g.panel("table", "KV cache shape",
            "conveyor_cache_config_info: tokens per block and blocks held, per replica.",
            [(f"conveyor_cache_config_info{{{SCHED}}}",
              "{{instance}}: {{block_size}} tokens x {{num_gpu_blocks}} blocks")], "short", 6, 8)
    g.panel("timeseries", "KV usage ratio",
            "Used blocks / total blocks, and token slots filled / slots allocated to running "
            "requests (what rounding to whole blocks wastes).",
            [(kv_ratio, "blocks used / total"),
             (ratio("conveyor_kv_slots_used{" + SCHED + "}",
                    "conveyor_kv_slots_allocated{" + SCHED + "}"), "slots used / allocated")],
            "percentunit", 6, 8, min=0, max=1)
    g.panel("timeseries", "Preemptions/s",
            "Requests preempted on KV exhaustion (blocks freed, recomputed later).",
            [(f"sum({rate('conveyor_preemptions_total')})", "preemptions")], "short", 6, 8)
    g.panel("timeseries", "Prefix cache hit ratio",
            "Full prompt blocks found in the prefix cache / blocks looked up.",
            [(ratio(rate("conveyor_prefix_cache_hits_total"),
                    rate("conveyor_prefix_cache_queries_total")), "hit ratio")],
            "percentunit", 6, 8, min=0, max=1)

    g.row("Workers")
    g.panel("timeseries", "Worker step compute time",
            "Forward pass + sampling of one step, per tensor-parallel rank.",
            percentiles("conveyor_worker_step_compute_seconds", WORKER, (0.5, 0.99),
                        by="rank", legend_by="rank"), "s", 12, 8)
    g.panel("timeseries", "Worker steps and errors/s", "Steps executed and rejected/failed, per rank.",
            [(f"sum by (rank) ({rate('conveyor_worker_steps_total', WORKER)})", "steps {{rank}}"),
             (f"sum by (rank) ({rate('conveyor_worker_step_errors_total', WORKER)})",
              "errors {{rank}}")], "short", 12, 8)
    g.panel("timeseries", "Worker tokens per step", "Tokens in one step, per rank.",
            percentiles("conveyor_worker_step_tokens", WORKER, (0.5, 0.99), by="rank",
                        legend_by="rank"), "short", 8, 8)
    g.panel("timeseries", "Worker memory", "KV-cache and weight memory held, per rank.",
            [(f"sum by (rank) (conveyor_worker_kv_cache_bytes{{{WORKER}}})", "KV cache {{rank}}"),
             (f"sum by (rank) (conveyor_worker_weight_bytes{{{WORKER}}})", "weights {{rank}}")],
            "bytes", 8, 8)
    g.panel("stat", "Model load time", "Time the last Init took, per rank.",
            [(f"max by (rank) (conveyor_worker_model_load_seconds{{{WORKER}}})", "rank {{rank}}")],
            "s", 8, 8)

    g.row("Worker failures and recovery")
    g.panel("timeseries", "Worker failures and recoveries",
            "Failures seen (failed or timed-out steps, failed liveness checks) and times every "
            "rank was re-initialised (docs/failure-handling.md).",
            [(f"sum(increase(conveyor_worker_failures_total{{{SCHED}}}[{RATE}]))", "failures"),
             (f"sum(increase(conveyor_worker_recoveries_total{{{SCHED}}}[{RATE}]))",
              "recoveries")], "short", 8, 8)
    g.panel("timeseries", "Recovery time", "From a worker failure until every rank serves again.",
            percentiles("conveyor_worker_recovery_seconds", SCHED, (0.5, 0.99)), "s", 8, 8)
    g.panel("timeseries", "Resumed requests and recomputed tokens/s",
            "Running requests kept through a failure, and the tokens whose KV it lost "
            "(computed again on resume).",
            [(f"sum({rate('conveyor_resumed_requests_total')})", "resumed requests"),
             (f"sum({rate('conveyor_recomputed_tokens_total')})", "recomputed tokens")],
            "short", 8, 8)
    return g.panels


def variables():
    def query_var(name, label, query):
        return {
            "name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": name},
            "includeAll": True, "multi": True, "allValue": ".*", "current": {},
            "options": [], "refresh": 2, "regex": "", "sort": 1, "hide": 0,
        }

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}, "options": [], "refresh": 1, "regex": "",
         "hide": 0, "includeAll": False, "multi": False},
        query_var("model", "Model", "label_values(conveyor_requests_running, model)"),
        query_var("policy", "Policy",
                  'label_values(conveyor_requests_running{model=~"$model"}, policy)'),
    ]


def dashboard():
    return {
        "uid": "conveyor-overview",
        "title": "Conveyor",
        "description": "Conveyor LLM inference server: throughput, latency, batching, "
                       "KV cache and workers (metrics: docs/metrics.md).",
        "tags": ["conveyor", "llm", "inference"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": variables()},
        "panels": build(),
    }


if __name__ == "__main__":
    json.dump(dashboard(), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
