#!/usr/bin/env bash
# Throw-away certificates for the TLS tests, made with the openssl CLI into DIR:
#   ca.crt            the deployment's CA (ca.key signs the rest but "rogue")
#   other-ca.crt      a CA nobody trusts
#   server.{crt,key}  localhost / 127.0.0.1, issued by ca (scheduler and workers)
#   client.{crt,key}  a client or scheduler identity, issued by ca
#   rogue.{crt,key}   localhost / 127.0.0.1, issued by other-ca
#   wrongname.{crt,key} issued by ca for elsewhere.example only
# Every leaf may serve and connect (serverAuth + clientAuth), as a worker rank does both.
#   tests/support/make_test_certs.sh DIR
set -euo pipefail
dir="$1"
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
ca() {
  key "$1"
  openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 2 -subj "/CN=$2" 2>/dev/null
}
leaf() {  # name issuer san
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' \
    "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
ca ca "Conveyor test CA"
ca other-ca "Someone else's CA"
leaf server ca "DNS:localhost,IP:127.0.0.1"
leaf client ca "DNS:client.conveyor.test"
leaf rogue other-ca "DNS:localhost,IP:127.0.0.1"
leaf wrongname ca "DNS:elsewhere.example"
