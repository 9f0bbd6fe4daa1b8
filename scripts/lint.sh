#!/usr/bin/env bash
# Checks the C++ sources: clang-format (the whole tree; any difference fails), the layering
# of the parts (scripts/check_layering.py), the paths comments name (scripts/check_paths.py),
# and clang-tidy (.clang-tidy) on the C++ files the latest change touches.
#   scripts/lint.sh [--format-only] [BASE]
# BASE (default HEAD~1, or $LINT_BASE): clang-tidy checks the .cc files changed between
# BASE and HEAD. clang-tidy needs build/compile_commands.json (scripts/run-tests.sh makes
# it; $BUILD_DIR overrides the folder).
set -euo pipefail
cd "$(dirname "$0")/.."
format_only=0
if [ "${1:-}" = "--format-only" ]; then
  format_only=1
  shift
fi
base="${1:-${LINT_BASE:-HEAD~1}}"
build="${BUILD_DIR:-build}"

mapfile -t sources < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
clang-format --dry-run -Werror "${sources[@]}"
echo "lint: clang-format: ${#sources[@]} files formatted"
# Which part may include which (docs/design.md), and that the paths comments and docs
# name exist: cheap, so with the formatting.
python3 scripts/check_layering.py
python3 scripts/check_paths.py
[ "$format_only" = 1 ] && exit 0

if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "lint: clang-tidy: no commit $base to compare with; nothing to check"
  exit 0
fi
# Translation units only (headers are checked through them, HeaderFilterRegex), and only
# those the build compiles (CUDA sources and the GPU-only build are not in the database).
mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" HEAD -- '*.cc' |
  while read -r f; do grep -q "\"file\": \"$PWD/$f\"" "$build/compile_commands.json" && echo "$f"; done)
if [ "${#changed[@]}" = 0 ]; then
  echo "lint: clang-tidy: no compiled .cc file changed since $base"
  exit 0
fi
echo "lint: clang-tidy on ${#changed[@]} file(s) changed since $base"
printf '%s\n' "${changed[@]}" | xargs -P "$(nproc)" -n 1 clang-tidy -p "$build" --quiet
echo "lint: clang-tidy: clean"
