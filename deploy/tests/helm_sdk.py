"""Renders or lints the chart with Helm's own engine (the helm-python-sdk package, which
binds Helm v4's Go SDK; no helm binary, no cluster, no network).

Run with a Python that has helm-python-sdk and PyYAML installed (run_chart_tests.sh makes
such a virtual environment with --install-helm-sdk):

    python helm_sdk.py render CHART [-f VALUES]... [--name R] [--namespace NS] [--notes] [-o FILE]
    python helm_sdk.py lint CHART [-f VALUES]...

`render` writes what `helm template` would (minus hooks and tests, which the chart has
none of), in the same "---\\n# Source: <template>" layout as render/main.go, so that the
two outputs can be compared. `lint` prints Helm's findings and exits 1 on any error
(or warning, with --strict).
"""

import argparse
import sys

import helm_python as helm
import yaml


def coalesce(src, dst):
    """Helm's merge of user values over defaults (null deletes a key)."""
    out = dict(dst)
    for key, value in src.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(value, out[key])
        else:
            out[key] = value
    return out


def user_values(files):
    values = {}
    for path in files:
        with open(path, encoding="utf-8") as f:
            values = coalesce(yaml.safe_load(f) or {}, values)
    return values


def render(args):
    with helm.Chart.load(args.chart) as chart:
        try:
            manifests = chart.render(user_values(args.values), name=args.name,
                                     namespace=args.namespace, is_install=True)
        except helm.HelmError as err:
            print(f"helm render: {err}", file=sys.stderr)
            return 1
    parts = []
    for name in sorted(manifests):
        text = manifests[name]
        is_notes = name.endswith("/NOTES.txt")
        if is_notes != args.notes or not text.strip() or name.split("/")[-1].startswith("_"):
            continue
        parts.append(text if args.notes else f"---\n# Source: {name}\n{text.rstrip()}\n")
    output = "".join(parts)
    if args.output == "-":
        sys.stdout.write(output)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(output)
    return 0


def lint(args):
    report = helm.lint(args.chart, user_values(args.values), strict=args.strict)
    worst = 0
    for msg in report.get("messages", []):
        severity = msg.get("severity", 0)
        worst = max(worst, severity)
        label = {1: "INFO", 2: "WARNING", 3: "ERROR"}.get(severity, "UNKNOWN")
        print(f"[{label}] {msg.get('path')}: {msg.get('error')}")
    for err in report.get("errors", []):
        print(f"[ERROR] {err}")
        worst = 3
    return 1 if worst >= (2 if args.strict else 3) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("render", "lint"):
        p = sub.add_parser(name)
        p.add_argument("chart")
        p.add_argument("-f", dest="values", action="append", default=[])
        if name == "render":
            p.add_argument("--name", default="conveyor")
            p.add_argument("--namespace", default="default")
            p.add_argument("--notes", action="store_true")
            p.add_argument("-o", dest="output", default="-")
        else:
            p.add_argument("--strict", action="store_true")
    args = parser.parse_args()
    return render(args) if args.command == "render" else lint(args)


if __name__ == "__main__":
    sys.exit(main())
