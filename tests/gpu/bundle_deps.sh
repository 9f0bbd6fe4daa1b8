#!/usr/bin/env bash
# Copies this Debian machine's Abseil, GoogleTest and nlohmann-json (headers, libraries,
# CMake configs) into one folder, laid out as under /, with NCCL's header in nccl/include,
# so that tests/gpu/run.sh can build the GPU tests on a GPU machine that lacks those
# packages and has no network, and run binaries built here (the Abseil libraries they
# load). Symbolic links are copied as files, as the device tool carries links only as
# links.
#
# Usage: tests/gpu/bundle_deps.sh [DEST] [EXTRA_DEBIAN_PACKAGE...]
#   DEST defaults to .gpu_deps in the repository root, which this script adds to
#   .git/info/exclude; carry it with the call: run(carry=[".gpu_deps"], ...).
# Size: about 10 MiB (the device tool carries at most 64 MiB per call).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$repo/.gpu_deps}
shift || true

# The Abseil runtime package is named after its version (libabsl20220623 on Debian 12).
absl_base=$(readlink -f /usr/lib/x86_64-linux-gnu/libabsl_base.so)
absl_runtime=$(dpkg -S "$absl_base" | cut -d: -f1)
packages=(libabsl-dev "$absl_runtime" libgtest-dev libgmock-dev nlohmann-json3-dev "$@")

rm -rf "$dest"
mkdir -p "$dest"
for package in "${packages[@]}"; do
  dpkg -L "$package" | while read -r file; do
    case "$file" in
      /usr/share/cmake/*) ;;  # nlohmann-json's CMake config lives there.
      /usr/share/* | /usr/src/*) continue ;;
    esac
    if [[ -f "$file" ]]; then
      mkdir -p "$dest$(dirname "$file")"
      cp -L "$file" "$dest$file"
    fi
  done
done

# NCCL is loaded at run time; building its communicator needs only the header.
for nccl_header in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
  if [[ -f "$nccl_header" ]]; then
    mkdir -p "$dest/nccl/include"
    cp -L "$nccl_header" "$dest/nccl/include/nccl.h"
    break
  fi
done

if [[ "$dest" == "$repo/.gpu_deps" ]]; then
  exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
  [[ "$exclude" = /* ]] || exclude="$repo/$exclude"
  mkdir -p "$(dirname "$exclude")"
  grep -qxF '/.gpu_deps/' "$exclude" 2>/dev/null || echo '/.gpu_deps/' >>"$exclude"
fi
echo "bundled ${packages[*]} into $dest ($(du -sh "$dest" | cut -f1))"
