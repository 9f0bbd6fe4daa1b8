{{/*
Names, labels and the few derived values that several templates share.
*/}}

{{- define "conveyor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: the release name, prefixed to the chart name unless it already
contains it. Truncated to 63 characters (DNS label limit).
*/}}
{{- define "conveyor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "conveyor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Scheduler Deployment and Service name. */}}
{{- define "conveyor.scheduler.name" -}}
{{- printf "%s-scheduler" (include "conveyor.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The Secret holding the scheduler's identity: scheduler.identity.existingSecret, or the
chart's own <fullname>-scheduler-id.
*/}}
{{- define "conveyor.scheduler.identitySecret" -}}
{{- if .Values.scheduler.identity.existingSecret }}
{{- .Values.scheduler.identity.existingSecret }}
{{- else }}
{{- printf "%s-id" (include "conveyor.scheduler.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The key of the identity in that Secret (a valid Secret data key). */}}
{{- define "conveyor.scheduler.identityKey" -}}
{{- $key := .Values.scheduler.identity.key }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString $key)) }}
{{- fail (printf "scheduler.identity.key must be a Secret key (letters, digits, '-', '_', '.'), not %q" (toString $key)) }}
{{- end }}
{{- $key }}
{{- end }}

{{/*
Worker StatefulSet and headless Service name (they must match for stable pod DNS names).
52 characters leave room for the pod ordinal and the controller-revision-hash label.
*/}}
{{- define "conveyor.worker.name" -}}
{{- printf "%s-worker" (include "conveyor.fullname" .) | trunc 52 | trimSuffix "-" }}
{{- end }}

{{- define "conveyor.labels" -}}
helm.sh/chart: {{ include "conveyor.chart" . }}
{{ include "conveyor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: conveyor
{{- end }}

{{- define "conveyor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "conveyor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component; call with (dict "ctx" $ "component" "scheduler"). */}}
{{- define "conveyor.componentLabels" -}}
{{ include "conveyor.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "conveyor.componentSelectorLabels" -}}
{{ include "conveyor.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "conveyor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "conveyor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "conveyor.scheduler.image" -}}
{{- $tag := .Values.scheduler.image.tag | default .Chart.AppVersion }}
{{- printf "%s:%s" .Values.scheduler.image.repository $tag }}
{{- end }}

{{- define "conveyor.worker.image" -}}
{{- $tag := .Values.worker.image.tag }}
{{- if not $tag }}
{{- $tag = ternary (printf "%s-cpu" .Chart.AppVersion) .Chart.AppVersion .Values.cpuOnly.enabled }}
{{- end }}
{{- printf "%s:%s" .Values.worker.image.repository $tag }}
{{- end }}

{{/* Validated tensor-parallel size. */}}
{{- define "conveyor.tensorParallelSize" -}}
{{- $tp := int .Values.tensorParallelSize }}
{{- if lt $tp 1 }}
{{- fail "tensorParallelSize must be at least 1" }}
{{- end }}
{{- $tp }}
{{- end }}

{{/*
The scheduler's --workers list: every rank's stable DNS name, in rank order.
*/}}
{{- define "conveyor.workerAddresses" -}}
{{- $name := include "conveyor.worker.name" . }}
{{- $addrs := list }}
{{- range $i := until (int (include "conveyor.tensorParallelSize" .)) }}
{{- $addrs = append $addrs (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.worker.grpcPort)) }}
{{- end }}
{{- join "," $addrs }}
{{- end }}

{{/* KV-cache bytes per rank handed to the scheduler. */}}
{{- define "conveyor.kvCacheBytes" -}}
{{- $bytes := int64 .Values.scheduler.kvCacheBytes }}
{{- if and .Values.cpuOnly.enabled (eq $bytes 0) }}
{{- $bytes = int64 .Values.cpuOnly.kvCacheBytes }}
{{- end }}
{{- $bytes }}
{{- end }}

{{- define "conveyor.scheduler.terminationGracePeriodSeconds" -}}
{{- add (int .Values.scheduler.drainTimeoutS) (int .Values.scheduler.terminationGraceMarginS) }}
{{- end }}

{{/* The model volume, and its read-only mount at the model path. */}}
{{- define "conveyor.modelVolume" -}}
- name: model
{{- if eq .Values.model.volume.type "hostPath" }}
  hostPath:
    path: {{ required "model.volume.hostPath.path is required" .Values.model.volume.hostPath.path }}
    {{- with .Values.model.volume.hostPath.type }}
    type: {{ . }}
    {{- end }}
{{- else if eq .Values.model.volume.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "model.volume.persistentVolumeClaim.claimName is required" .Values.model.volume.persistentVolumeClaim.claimName }}
    readOnly: true
{{- else }}
{{- fail (printf "model.volume.type must be hostPath or persistentVolumeClaim, not %q" .Values.model.volume.type) }}
{{- end }}
{{- end }}

{{- define "conveyor.modelVolumeMount" -}}
- name: model
  mountPath: {{ required "model.path is required" .Values.model.path }}
  readOnly: true
  {{- with .Values.model.volume.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end }}

{{/* gRPC probe; call with (dict "probe" <settings> "port" <port> "service" <name>). */}}
{{- define "conveyor.grpcProbe" -}}
grpc:
  port: {{ .port }}
  {{- with .service }}
  service: {{ . | quote }}
  {{- end }}
{{- with .probe }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/*
Security: TLS on the client API, mTLS between the scheduler and its workers, bearer
tokens. Where the Secrets are mounted (read-only, one directory each), and the checks of
the values, which the scheduler Deployment includes so a bad combination fails the render.
*/}}
{{- define "conveyor.tls.clientApiDir" -}}/etc/conveyor/tls/client-api{{- end }}
{{- define "conveyor.tls.clientCaDir" -}}/etc/conveyor/tls/client-ca{{- end }}
{{- define "conveyor.tls.internalDir" -}}/etc/conveyor/tls/internal{{- end }}
{{- define "conveyor.auth.dir" -}}/etc/conveyor/auth{{- end }}

{{/* The client CA file for --tls_client_ca_file: the separate CA Secret's, or the client API Secret's own ca.crt. */}}
{{- define "conveyor.tls.clientCaFile" -}}
{{- if .Values.tls.clientApi.clientCaSecretName }}
{{- printf "%s/ca.crt" (include "conveyor.tls.clientCaDir" .) }}
{{- else }}
{{- printf "%s/ca.crt" (include "conveyor.tls.clientApiDir" .) }}
{{- end }}
{{- end }}

{{/* "true" when a component serves TLS on its gRPC port, so its probes need the plaintext health port. */}}
{{- define "conveyor.scheduler.healthPortOn" -}}
{{- if .Values.tls.clientApi.enabled }}true{{ end }}
{{- end }}
{{- define "conveyor.worker.healthPortOn" -}}
{{- if .Values.tls.internal.enabled }}true{{ end }}
{{- end }}

{{/*
A Secret as a read-only volume with only the keys listed; call with
(dict "name" <volume> "secret" <Secret name> "items" (list (list <key> <file>) ...)).
Mode 0440 (288): the kubelet makes the files root-owned with the pod's fsGroup as group,
so the non-root UID reads them through that group and nobody else can. Listing the keys
makes a Secret without one fail the mount with a clear event instead of a missing file.
*/}}
{{- define "conveyor.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ .secret }}
    defaultMode: 288
    items:
      {{- range .items }}
      - key: {{ index . 0 | quote }}
        path: {{ index . 1 }}
      {{- end }}
{{- end }}

{{- define "conveyor.validateSecurity" -}}
{{- $client := .Values.tls.clientApi }}
{{- $internal := .Values.tls.internal }}
{{- $auth := .Values.auth }}
{{- if and $client.enabled (not $client.secretName) }}
{{- fail "tls.clientApi.secretName is required when tls.clientApi.enabled is true (a kubernetes.io/tls Secret with tls.crt and tls.key, as cert-manager writes it)" }}
{{- end }}
{{- if and $client.requireClientCert (not $client.enabled) }}
{{- fail "tls.clientApi.requireClientCert needs tls.clientApi.enabled: client certificates are checked in the TLS handshake" }}
{{- end }}
{{- if and $client.clientCaSecretName (not $client.requireClientCert) }}
{{- fail "tls.clientApi.clientCaSecretName is only used with tls.clientApi.requireClientCert: set it, or drop the CA Secret" }}
{{- end }}
{{- if and $internal.enabled (not (and $internal.schedulerSecretName $internal.workerSecretName)) }}
{{- fail "tls.internal.enabled needs both tls.internal.schedulerSecretName and tls.internal.workerSecretName: mTLS between the scheduler and the workers needs a certificate on each side" }}
{{- end }}
{{- if and (or $client.enabled $internal.enabled) (lt (int .Values.tls.refreshSeconds) 1) }}
{{- fail "tls.refreshSeconds must be at least 1 (seconds between re-reads of the certificate files)" }}
{{- end }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString $auth.tokensKey)) }}
{{- fail (printf "auth.tokensKey must be a Secret key (letters, digits, '-', '_', '.'), not %q" (toString $auth.tokensKey)) }}
{{- end }}
{{- if lt (int $auth.maxConcurrentPerToken) 0 }}
{{- fail "auth.maxConcurrentPerToken must not be negative (0 = no limit)" }}
{{- end }}
{{- if and (gt (int $auth.maxConcurrentPerToken) 0) (not $auth.tokensSecretName) }}
{{- fail "auth.maxConcurrentPerToken needs auth.tokensSecretName: the limit is per bearer token" }}
{{- end }}
{{- range $who := list "scheduler" "worker" }}
{{- $v := index $.Values $who }}
{{- if include (printf "conveyor.%s.healthPortOn" $who) $ }}
{{- $port := int $v.healthPort }}
{{- if or (lt $port 1) (gt $port 65535) (eq $port (int $v.grpcPort)) (eq $port (int $v.metricsPort)) }}
{{- fail (printf "%s.healthPort must be a port (1-65535) other than %s.grpcPort and %s.metricsPort: with TLS on, the probes use this plaintext health-only port (got %d)" $who $who $who $port) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (or $client.enabled $internal.enabled $auth.tokensSecretName) (not (dig "fsGroup" nil (.Values.podSecurityContext | default dict))) }}
{{- fail "podSecurityContext.fsGroup must be set when TLS or tokens are on: the mounted Secret files are mode 0440, root-owned, and readable by the pods' non-root user only through that group" }}
{{- end }}
{{- end }}
