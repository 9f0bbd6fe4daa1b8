#!/usr/bin/python3
"""Static checks of deploy/docker/*.Dockerfile (Docker cannot run here).

    check_dockerfiles.py REPO_ROOT

For each Dockerfile, with the repository root as the build context and
<Dockerfile>.dockerignore as its ignore file: every `COPY` source from the context exists
and is not ignored; every `COPY --from` names an earlier stage; every file a `RUN` calls
under deploy/ or scripts/ is in the context; build ARGs used in FROM are declared before
the first FROM; the final stage of each target runs as a non-root user with an ENTRYPOINT;
the builds use the CMake options the project documents. The router image
(router.Dockerfile) builds nothing: it must copy nothing from the context (its
.dockerignore excludes everything), install exactly the pinned router packages
(ROUTER_PINS, which the chart's default router image tags name too) with its default
build arguments one of them, and refuse any other. Exit status 1 on any failure.
"""

import fnmatch
import os
import re
import sys

EXPECTED_CMAKE = {
    "scheduler.Dockerfile": ["-DCONVEYOR_CUDA=OFF", "-DCONVEYOR_BUILD_TESTS=OFF",
                             "-DCONVEYOR_BUILD_BENCH=OFF", "ninja -C build conveyor-scheduler"],
    "worker.Dockerfile": ["-DCONVEYOR_CUDA=ON", "-DCONVEYOR_CUDA=OFF", "-DCONVEYOR_BUILD_TESTS=OFF",
                          "-DCONVEYOR_BUILD_BENCH=OFF", "ninja -C build conveyor-worker"],
}

# The routers the chart can run, as router.Dockerfile pins them (package: version).
ROUTER_PINS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}
# Dockerfiles that compile Conveyor (the others install a prebuilt package).
BUILDS_CONVEYOR = {"scheduler.Dockerfile", "worker.Dockerfile"}


def instructions(text):
    """Joins continuation lines; yields (keyword, arguments)."""
    logical = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not logical and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#") and logical:
            continue
        if stripped.endswith("\\"):
            logical += stripped[:-1] + " "
            continue
        logical += stripped
        keyword, _, args = logical.partition(" ")
        yield keyword.upper(), args.strip()
        logical = ""


def ignore_rules(path):
    rules = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    negate = line.startswith("!")
                    rules.append((negate, line.lstrip("!").rstrip("/")))
    return rules


def ignored(rel, rules):
    """Docker's rule: the last matching pattern wins; a pattern also covers what is below it."""
    result = False
    parts = rel.split("/")
    for negate, pattern in rules:
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, pattern) or (
                    pattern.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], pattern[3:])):
                result = not negate
                break
    return result


def check(repo, dockerfile, errors):
    name = os.path.basename(dockerfile)
    with open(dockerfile, encoding="utf-8") as f:
        text = f.read()
    rules = ignore_rules(dockerfile + ".dockerignore")
    if not rules:
        errors.append(f"{name}: no {name}.dockerignore next to it")
    args_before_from, stages, seen_from = set(), [], False
    final = {}
    for keyword, args in instructions(text):
        if keyword == "ARG" and not seen_from:
            args_before_from.add(args.split("=")[0])
        elif keyword == "FROM":
            seen_from = True
            for var in re.findall(r"\$\{(\w+)\}", args):
                if var not in args_before_from:
                    errors.append(f"{name}: FROM uses ${{{var}}}, not declared before the first FROM")
            m = re.search(r"\bAS\s+(\S+)", args, re.I)
            stages.append(m.group(1) if m else f"#{len(stages)}")
            final = {"stage": stages[-1]}
        elif keyword == "COPY":
            words = args.split()
            from_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            paths = [w for w in words if not w.startswith("--")]
            sources = paths[:-1]
            if from_stage:
                if from_stage not in stages[:-1]:
                    errors.append(f"{name}: COPY --from={from_stage} names no earlier stage")
                continue
            for src in sources:
                rel = os.path.normpath(src)
                if rel == ".":
                    continue
                if not os.path.exists(os.path.join(repo, rel)):
                    errors.append(f"{name}: COPY source {src} does not exist")
                elif ignored(rel, rules):
                    errors.append(f"{name}: COPY source {src} is excluded by the .dockerignore")
        elif keyword == "RUN":
            for script in re.findall(r"(?:^|[\s;&|])((?:deploy|scripts)/[\w./-]+)", args):
                if not os.path.exists(os.path.join(repo, script)):
                    errors.append(f"{name}: RUN calls {script}, which does not exist")
                elif ignored(script, rules):
                    errors.append(f"{name}: RUN calls {script}, excluded by the .dockerignore")
                elif not os.access(os.path.join(repo, script), os.X_OK):
                    errors.append(f"{name}: {script} is not executable")
        elif keyword in ("USER", "ENTRYPOINT"):
            final[keyword] = args
            if keyword == "USER" and args.split(":")[0] in ("0", "root"):
                errors.append(f"{name}: stage {final['stage']} runs as root")
        if keyword == "ENTRYPOINT" and "USER" not in final:
            errors.append(f"{name}: stage {final['stage']} has an ENTRYPOINT but no non-root USER")
    if "ENTRYPOINT" not in final or "USER" not in final:
        errors.append(f"{name}: the default (last) stage needs USER and ENTRYPOINT")
    flat = " ".join(f"{k} {a}" for k, a in instructions(text))
    for needle in EXPECTED_CMAKE.get(name, []):
        if needle not in flat:
            errors.append(f"{name}: does not build with {needle}")
    if name in BUILDS_CONVEYOR and "scripts/install-deps.sh" not in flat:
        errors.append(f"{name}: the builder does not run scripts/install-deps.sh")
    if name == "router.Dockerfile":
        check_router(name, text, rules, errors)
    # A context that ships the host's build tree would poison the CMake cache.
    for path in ("build", "build-cuda", ".git"):
        if not ignored(path, rules):
            errors.append(f"{name}: .dockerignore does not exclude {path}")


def check_router(name, text, rules, errors):
    """The router image: pinned PyPI routers only, nothing from the build context."""
    steps = list(instructions(text))
    if any(k in ("COPY", "ADD") and "--from=" not in a for k, a in steps):
        errors.append(f"{name}: copies from the build context, which it does not need")
    if not ignored("deploy/docker/router.Dockerfile", rules) or not ignored("scheduler", rules):
        errors.append(f"{name}: .dockerignore must exclude the whole context")
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    default = (args.get("ROUTER_PACKAGE"), args.get("ROUTER_VERSION"))
    if default not in ROUTER_PINS.items():
        errors.append(f"{name}: default build arguments {default} are not a pinned router {ROUTER_PINS}")
    runs = " ".join(a for k, a in steps if k == "RUN")
    # The accepted arm of the `case` that guards the install: "pkg==ver|pkg==ver) ;;".
    arm = re.search(r"\bin\s+([^)]*)\)\s*;;", runs)
    pinned = set(re.findall(r"([a-z]+-router)==([0-9][0-9.]*)", arm.group(1) if arm else ""))
    if pinned != set(ROUTER_PINS.items()):
        errors.append(f"{name}: pins {sorted(pinned)}, expected exactly {sorted(ROUTER_PINS.items())}")
    if not re.search(r'pip install [^;&|]*"\$\{ROUTER_PACKAGE\}==\$\{ROUTER_VERSION\}"', runs):
        errors.append(f"{name}: pip does not install \"${{ROUTER_PACKAGE}}==${{ROUTER_VERSION}}\"")
    if "exit 1" not in runs:
        errors.append(f"{name}: does not refuse a router version it does not pin")


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    docker_dir = os.path.join(repo, "deploy", "docker")
    dockerfiles = sorted(os.path.join(docker_dir, f) for f in os.listdir(docker_dir)
                         if f.endswith(".Dockerfile"))
    errors = []
    for dockerfile in dockerfiles:
        check(repo, dockerfile, errors)
    for err in errors:
        print(f"FAIL {err}")
    print(f"{len(dockerfiles)} Dockerfiles, {len(errors)} problems")
    return 1 if errors or len(dockerfiles) < 2 else 0


if __name__ == "__main__":
    sys.exit(main())
