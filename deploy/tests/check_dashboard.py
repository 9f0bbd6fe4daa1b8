#!/usr/bin/python3
"""Checks the Grafana dashboard against the metrics Conveyor exports.

    check_dashboard.py DASHBOARD.json [--metrics-doc docs/metrics.md] [--metrics-file SCRAPE]...
                       [--promql-rules OUT.yaml]

Exported metrics come from docs/metrics.md by default, or from Prometheus text scrapes
(--metrics-file, repeatable: e.g. a scheduler's and a worker's /metrics). A scrape of one
component says nothing about the other: metrics of a component that no scrape covers
(scheduler vs conveyor_worker_*) are checked against the doc instead, and the output says so;
so are families keyed by an event label ({reason}, {code}) that a scrape lacks, since
prometheus-cpp exports a labelled family only once its first series exists.

Checks: the JSON parses and is a dashboard with a `datasource` variable and `model` and
`policy` query variables, every panel queries through the variable; every conveyor_*
name in a PromQL expression is exported (histograms only through _bucket/_sum/_count);
every label in a selector or in by()/without() exists on the metrics of that expression;
every metric family of the doc is shown somewhere. --promql-rules writes the expressions
as a Prometheus rules file, for `promtool check rules` to parse them.
Exit status 1 on any failure.
"""

import argparse
import json
import re
import sys

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus attaches to every scraped series (target labels, ServiceMonitor
# relabelling), so dashboards may filter or group by them.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container",
                 "component"}
METRIC_RE = re.compile(r"\bconveyor_[a-zA-Z0-9_:]*")
SELECTOR_RE = re.compile(r"\b(conveyor_[a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
MATCHER_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"(?:[^\"\\]|\\.)*\"")
GROUPING_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+")
LABEL_NAME_RE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"(?:[^\"\\]|\\.)*\"")


# The scheduler's own series about its workers (failures and recovery): scheduler labels,
# whatever their prefix says.
SCHEDULER_SIDE = {"conveyor_worker_failures_total", "conveyor_worker_recoveries_total",
                  "conveyor_worker_recovery_seconds"}


def is_worker_metric(name):
    """Whether a series or family is a worker process's (labels model, rank)."""
    base = name
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in SCHEDULER_SIDE:
            base = name[: -len(suffix)]
    return name.startswith("conveyor_worker_") and base not in SCHEDULER_SIDE


class Catalog:
    """Metric families: name -> (type, label names or None when unknown)."""

    def __init__(self, source):
        self.source = source
        self.families = {}
        # Families whose series are keyed by an event label (reason, code): prometheus-cpp
        # exports such a family only once its first series exists.
        self.event_labelled = set()

    def add(self, name, kind, labels=None):
        old_kind, old_labels = self.families.get(name, (kind, None))
        if labels is not None:
            old_labels = (old_labels or set()) | set(labels)
        self.families[name] = (kind if kind != "untyped" else old_kind, old_labels)

    def covers_component(self, worker):
        return any(is_worker_metric(n) == worker for n in self.families)

    def resolve(self, series):
        """Returns (family, type, labels) for a series name, or None if not exported."""
        if series in self.families:
            kind, labels = self.families[series]
            if kind in ("histogram", "summary"):
                return None  # a histogram's own name is not a series
            return series, kind, labels
        for suffix in HISTOGRAM_SUFFIXES:
            if series.endswith(suffix):
                base = series[: -len(suffix)]
                kind, labels = self.families.get(base, (None, None))
                if kind in ("histogram", "summary"):
                    if labels is not None and suffix == "_bucket":
                        labels = labels | {"le"}
                    return base, kind, labels
        return None


def catalog_from_doc(path):
    """Parses the tables of docs/metrics.md: | `name{labels}` | type | meaning |."""
    catalog = Catalog(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for match in re.finditer(r"^\|\s*`(conveyor_[a-z0-9_]+)(\{[^}]*\})?`\s*\|\s*(\w+)\s*\|",
                             text, re.M):
        name, extra, kind = match.group(1), match.group(2), match.group(3)
        labels = {"model", "rank"} if is_worker_metric(name) else {"model", "policy"}
        if extra:
            labels |= {label.strip() for label in extra.strip("{}").split(",") if label.strip()}
            catalog.event_labelled.add(name)
        catalog.add(name, kind, labels)
    if not catalog.families:
        raise SystemExit(f"{path}: no metric table rows found")
    return catalog


def catalog_from_scrapes(paths):
    """Parses Prometheus text exposition files (# TYPE lines and samples)."""
    catalog = Catalog(", ".join(paths))
    for path in paths:
        types = {}
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for line in lines:
            if line.startswith("# TYPE "):
                parts = line.split()
                if len(parts) >= 4:
                    types[parts[2]] = parts[3]
                    catalog.add(parts[2], parts[3])
        for line in lines:
            if not line or line.startswith("#"):
                continue
            m = SAMPLE_RE.match(line)
            if not m:
                continue
            name, labels = m.group(1), set(LABEL_NAME_RE.findall(m.group(3) or ""))
            family = name
            for suffix in HISTOGRAM_SUFFIXES + ("_total", "_created"):
                base = name[: -len(suffix)] if name.endswith(suffix) else None
                if base and types.get(base) in ("histogram", "summary", "counter"):
                    family = base
                    break
            if types.get(family) in ("histogram", "summary"):
                catalog.add(family, types[family], labels - {"le", "quantile"})
            else:
                # OpenMetrics names a counter family without _total; keep the series name.
                catalog.add(name, types.get(family, types.get(name, "untyped")), labels)
    return catalog


def walk_panels(panels):
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def expressions(dashboard):
    """Yields (where, expr) for every PromQL expression: targets and variable queries."""
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"panel {panel.get('id')} '{panel.get('title')}'", target["expr"]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            inner = re.match(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$",
                             query or "")
            if inner:
                yield f"variable ${var['name']}", f"sum by ({inner.group(2)}) ({inner.group(1)})"
            elif query:
                yield f"variable ${var['name']}", query


def check_structure(dashboard, errors):
    variables = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("no `datasource` variable of type datasource (query: prometheus)")
    for name in ("model", "policy"):
        if variables.get(name, {}).get("type") != "query":
            errors.append(f"no `{name}` query variable")
    for name, var in variables.items():
        if var.get("type") == "query" and var.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"variable ${name} does not query through ${{datasource}}")
    ids = []
    for panel in walk_panels(dashboard.get("panels", [])):
        ids.append(panel.get("id"))
        if "gridPos" not in panel:
            errors.append(f"panel {panel.get('id')} has no gridPos")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"panel '{panel.get('title')}' does not use the ${{datasource}} variable")
        if not panel.get("targets"):
            errors.append(f"panel '{panel.get('title')}' has no query")
        for target in panel.get("targets", []):
            if target.get("datasource", {}).get("uid", "${datasource}") != "${datasource}":
                errors.append(f"panel '{panel.get('title')}' target uses a fixed data source")
    if len(ids) != len(set(ids)):
        errors.append(f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}")


def check_expressions(dashboard, primary, fallback, errors, notes):
    used = set()
    for where, expr in expressions(dashboard):
        metric_labels = set()
        labels_known = True
        for series in sorted(set(METRIC_RE.findall(expr))):
            catalog = primary
            if fallback and not primary.covers_component(is_worker_metric(series)):
                catalog = fallback
                component = "worker" if is_worker_metric(series) else "scheduler"
                notes.add(f"{component} metrics: no scrape covers this component; checked "
                          f"against {fallback.source}")
            found = catalog.resolve(series)
            if not found and fallback and catalog is primary and series in fallback.event_labelled:
                catalog, found = fallback, fallback.resolve(series)
                notes.add(f"{series}: not in the scrape, which is expected before its first "
                          f"event (an empty labelled family is not exported); checked against "
                          f"{fallback.source}")
            if not found:
                errors.append(f"{where}: {series} is not exported (per {catalog.source})")
                labels_known = False
                continue
            family, _, labels = found
            used.add(family)
            if labels is None:
                labels_known = False
                notes.add(f"{family}: no samples in the scrape, labels not checked")
            else:
                metric_labels |= labels
        for series, matchers in SELECTOR_RE.findall(expr):
            catalog = primary
            if fallback and not primary.covers_component(is_worker_metric(series)):
                catalog = fallback
            found = catalog.resolve(series)
            if not found and fallback:
                found = fallback.resolve(series) if series in fallback.event_labelled else None
            if not found or found[2] is None:
                continue
            allowed = found[2] | TARGET_LABELS
            for label, _ in MATCHER_RE.findall(matchers):
                if label not in allowed:
                    errors.append(f"{where}: {series} has no label '{label}' "
                                  f"(it has {sorted(found[2])})")
        if labels_known:
            for group in GROUPING_RE.findall(expr):
                for label in (g.strip() for g in group.split(",")):
                    if label and label not in metric_labels | TARGET_LABELS | {"le"}:
                        errors.append(f"{where}: groups by '{label}', which none of its "
                                      f"metrics carry ({sorted(metric_labels)})")
    return used


def write_rules(dashboard, path):
    """PromQL as recording rules, with Grafana's variables replaced by plain values."""
    lines = ["groups:", "  - name: conveyor-dashboard", "    rules:"]
    for i, (_, expr) in enumerate(expressions(dashboard)):
        expr = expr.replace("$__rate_interval", "5m").replace("$model", ".*")
        expr = expr.replace("$policy", ".*")
        lines += [f"      - record: conveyor_dashboard:expr{i}", f"        expr: {json.dumps(expr)}"]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dashboard")
    parser.add_argument("--metrics-doc", default="docs/metrics.md")
    parser.add_argument("--metrics-file", action="append", default=[])
    parser.add_argument("--promql-rules")
    args = parser.parse_args()

    with open(args.dashboard, encoding="utf-8") as f:
        try:
            dashboard = json.load(f)
        except json.JSONDecodeError as err:
            print(f"FAIL {args.dashboard}: not JSON: {err}")
            return 1

    doc = catalog_from_doc(args.metrics_doc)
    primary, fallback = (catalog_from_scrapes(args.metrics_file), doc) if args.metrics_file \
        else (doc, None)
    errors, notes = [], set()
    check_structure(dashboard, errors)
    used = check_expressions(dashboard, primary, fallback, errors, notes)
    shown = {found[0] for _, expr in expressions(dashboard)
             for found in map(doc.resolve, METRIC_RE.findall(expr)) if found}
    for family in sorted(set(doc.families) - shown):
        errors.append(f"{family} (docs/metrics.md) is on no panel")
    if args.promql_rules:
        write_rules(dashboard, args.promql_rules)

    exprs = list(expressions(dashboard))
    print(f"{len(exprs)} expressions, {len(used)} metric families, metrics from {primary.source}")
    for note in sorted(notes):
        print(f"note: {note}")
    errors = list(dict.fromkeys(errors))
    for err in errors:
        print(f"FAIL {err}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
