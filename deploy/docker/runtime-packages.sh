#!/bin/sh
# Works out and installs the Debian/Ubuntu packages a binary needs at run time, so that
# a runtime image carries the shared libraries the build stage linked against and nothing
# else, on any base (Debian 12, Ubuntu 24.04 with its t64 package names, CUDA images).
#
#   runtime-packages.sh list BINARY...   (build stage) print "package" or, for NVIDIA
#                                        packages, "package=version", one per line
#   runtime-packages.sh install FILE     (runtime stage) apt-get install the listed
#                                        packages that are not installed yet
#   runtime-packages.sh check FILE       (runtime stage) fail if a listed package is missing
#   runtime-packages.sh verify BINARY... (runtime stage) fail if a library is not found
set -eu

# Provided by the host at run time (NVIDIA container toolkit), never by the image.
HOST_LIBS='libcuda\.so|libnvidia-ml\.so'

owner() {
  # dpkg knows a library by the path its package shipped; with merged /usr that may be
  # the /lib or the /usr/lib spelling, or the symlink's target.
  for path in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    if out=$(dpkg-query -S "$path" 2>/dev/null); then
      printf '%s\n' "$out" | head -n 1 | cut -d: -f1 | cut -d, -f1
      return 0
    fi
  done
  echo "runtime-packages: no package owns $1" >&2
  return 1
}

# Prints the specs of FILE whose package is not installed, space-separated.
not_installed() {
  while read -r spec; do
    [ -n "$spec" ] || continue
    if ! dpkg-query -W -f='${Status}' "${spec%%=*}" 2>/dev/null | grep -q 'ok installed'; then
      printf ' %s' "$spec"
    fi
  done < "$1"
}

case "${1:-}" in
  list)
    shift
    libs=$(ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u)
    [ -n "$libs" ] || { echo "runtime-packages: no shared libraries found for $*" >&2; exit 1; }
    specs=""
    for lib in $libs; do
      case "$lib" in
        /usr/local/cuda/*|/usr/local/cuda-*/*)
          # A toolkit installed from NVIDIA's tarball (as on build machines) belongs to no
          # package; the CUDA base image of the runtime stage provides these libraries.
          dpkg-query -S "$lib" >/dev/null 2>&1 || continue ;;
      esac
      pkg=$(owner "$lib")
      case "$pkg" in
        # NVIDIA's packages come in one version per CUDA release: pin the one built against.
        cuda-*|libcu*|libnccl*|libnv*) pkg="$pkg=$(dpkg-query -W -f='${Version}' "$pkg")" ;;
      esac
      specs="$specs$pkg
"
    done
    printf '%s' "$specs" | sort -u
    ;;
  install)
    missing=$(not_installed "$2")
    if [ -n "$missing" ]; then
      apt-get update -qq
      # shellcheck disable=SC2086  # one word per package
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
      rm -rf /var/lib/apt/lists/*
    fi
    ;;
  check)
    missing=$(not_installed "$2")
    if [ -n "$missing" ]; then
      echo "runtime-packages: not installed:$missing" >&2
      exit 1
    fi
    ;;
  verify)
    shift
    if ldd "$@" | grep 'not found' | grep -Ev "$HOST_LIBS"; then
      echo "runtime-packages: shared libraries missing (above)" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 list BINARY... | install FILE | check FILE | verify BINARY..." >&2
    exit 2
    ;;
esac
