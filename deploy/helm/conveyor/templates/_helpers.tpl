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

{{/*
Model replicas: the number of scheduler + worker groups (replicas), validated.
*/}}
{{- define "conveyor.replicas" -}}
{{- $n := .Values.replicas }}
{{- if not (or (kindIs "float64" $n) (kindIs "int64" $n) (kindIs "int" $n)) }}
{{- fail (printf "replicas must be a whole number of scheduler + worker groups (at least 1), not %q" (toString $n)) }}
{{- end }}
{{- if or (ne (toString (int $n)) (toString $n)) (lt (int $n) 1) }}
{{- fail (printf "replicas must be a whole number of scheduler + worker groups (at least 1), not %s" (toString $n)) }}
{{- end }}
{{- int $n }}
{{- end }}

{{/*
A group's templates run once per group, with `.` set to the group's context: the top-level
objects plus "group", the index, built in each template as
  (dict "Values" $.Values "Release" $.Release "Chart" $.Chart "Capabilities" $.Capabilities "group" $i)
The helpers below name and label group i's objects when given that context, and what all
groups share (the scheduler Service, its policy) when given the top-level one.
*/}}

{{/* "-<i>" in the names of group i's objects when there are several groups, "" with one. */}}
{{- define "conveyor.groupSuffix" -}}
{{- if and (hasKey . "group") (gt (int (include "conveyor.replicas" .)) 1) }}
{{- printf "-%d" (int .group) }}
{{- end }}
{{- end }}

{{/*
The name of one of a group's objects, <fullname>[-<group>]-<what>, at most `max` characters.
With several groups the release part is shortened instead, so the group index survives; with
one, the name is what it always was. Call with (dict "ctx" . "what" "worker" "max" 52).
*/}}
{{- define "conveyor.groupObjectName" -}}
{{- $suffix := include "conveyor.groupSuffix" .ctx }}
{{- $tail := printf "%s-%s" $suffix .what }}
{{- if $suffix }}
{{- printf "%s%s" (include "conveyor.fullname" .ctx | trunc (int (sub .max (len $tail))) | trimSuffix "-") $tail }}
{{- else }}
{{- printf "%s%s" (include "conveyor.fullname" .ctx) $tail | trunc (int .max) | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
Scheduler name: of group .group's Deployment, or (top-level context) of the Service that
reaches every group's scheduler.
*/}}
{{- define "conveyor.scheduler.name" -}}
{{- include "conveyor.groupObjectName" (dict "ctx" . "what" "scheduler" "max" 63) }}
{{- end }}

{{/*
The Secret holding a group's scheduler identity: scheduler.identity.existingSecret, or the
chart's own <fullname>[-<group>]-scheduler-id, one per group.
*/}}
{{- define "conveyor.scheduler.identitySecret" -}}
{{- if .Values.scheduler.identity.existingSecret }}
{{- .Values.scheduler.identity.existingSecret }}
{{- else if include "conveyor.groupSuffix" . }}
{{- include "conveyor.groupObjectName" (dict "ctx" . "what" "scheduler-id" "max" 63) }}
{{- else }}
{{- printf "%s-id" (include "conveyor.scheduler.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The key of the identity in that Secret (a valid Secret data key). Every group has a Secret
of its own; several groups that share one existingSecret read one key each, <key>-<group>,
since two schedulers must never present the same id.
*/}}
{{- define "conveyor.scheduler.identityKey" -}}
{{- $key := .Values.scheduler.identity.key }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString $key)) }}
{{- fail (printf "scheduler.identity.key must be a Secret key (letters, digits, '-', '_', '.'), not %q" (toString $key)) }}
{{- end }}
{{- if .Values.scheduler.identity.existingSecret }}
{{- printf "%s%s" (toString $key) (include "conveyor.groupSuffix" .) }}
{{- else }}
{{- $key }}
{{- end }}
{{- end }}

{{/*
A group's worker StatefulSet and headless Service name (they must match for stable pod DNS
names). 52 characters leave room for the pod ordinal and the controller-revision-hash label.
*/}}
{{- define "conveyor.worker.name" -}}
{{- include "conveyor.groupObjectName" (dict "ctx" . "what" "worker" "max" 52) }}
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

{{/*
Labels of one component (and, in a group's context, of the group); call with
(dict "ctx" $ "component" "scheduler").
*/}}
{{- define "conveyor.componentLabels" -}}
{{ include "conveyor.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- include "conveyor.groupLabel" .ctx }}
{{- end }}

{{/*
Selector labels of one component; in a group's context (several groups) also the group's,
so that no selector, Service or policy of one group reaches another's pods.
*/}}
{{- define "conveyor.componentSelectorLabels" -}}
{{ include "conveyor.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- include "conveyor.groupLabel" .ctx }}
{{- end }}

{{/*
The label that tells the groups' pods apart, on a line of its own: conveyor.ai/replica-group
"<i>" in group i's context when there are several groups, nothing otherwise.
*/}}
{{- define "conveyor.groupLabel" -}}
{{- with include "conveyor.groupSuffix" . }}
conveyor.ai/replica-group: {{ trimPrefix "-" . | quote }}
{{- end }}
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

{{/*
Routing in front of the replicas: a router Deployment (router.*) or a Gateway API
InferencePool with its endpoint picker (inferencePool.*). Both reach every group's scheduler
pods by IP at scheduler.httpPort, selected by the scheduler's component labels (all groups).

The routers the chart can run: the PyPI package versions deploy/docker/router.Dockerfile pins
(the default image tag is <type>-<version>), the arguments before the flags (sglang-router's
subcommand), and the policies and log levels each one's --help lists. kv_aware (vllm-router)
is left out: it routes on the KV-cache events vLLM workers publish, which Conveyor does not.
*/}}
{{- define "conveyor.router.catalog" -}}
vllm-router:
  version: 0.1.17
  subcommand: []
  policies: [cache_aware, round_robin, power_of_two, random, consistent_hash, sticky_least_loaded]
  logLevels: [debug, info, warning, error, critical]
sglang-router:
  version: 0.3.2
  subcommand: [launch]
  policies: [cache_aware, round_robin, power_of_two, random, manual]
  logLevels: [debug, info, warn, error]
{{- end }}

{{- define "conveyor.router.name" -}}
{{- printf "%s-router" (include "conveyor.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "conveyor.router.image" -}}
{{- $router := index (include "conveyor.router.catalog" . | fromYaml) .Values.router.type }}
{{- $tag := .Values.router.image.tag | default (printf "%s-%s" .Values.router.type $router.version) }}
{{- printf "%s:%s" .Values.router.image.repository $tag }}
{{- end }}

{{/* A TCP port value: 1-65535, or the render fails naming the value. */}}
{{- define "conveyor.port" -}}
{{- $port := int .port }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "%s must be a port (1-65535), not %v" .name .port) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
What routing in front of the replicas needs from the schedulers' HTTP port: that there is
one, and that it is plaintext. `who` names the values that asked for it.
*/}}
{{- define "conveyor.validateRoutedHttp" -}}
{{- if not (int .ctx.Values.scheduler.httpPort) }}
{{- fail (printf "%s needs scheduler.httpPort: %s calls the schedulers' OpenAI HTTP API, which scheduler.httpPort: 0 turns off" .who .what) }}
{{- end }}
{{- if .ctx.Values.tls.clientApi.enabled }}
{{- fail (printf "%s cannot be used with tls.clientApi.enabled: %s reaches each scheduler pod by IP and speaks plaintext HTTP to scheduler.httpPort, which then serves only TLS, with a certificate for the Service name and not for pod IPs%s. Set tls.clientApi.enabled=false and keep the schedulers private with networkPolicy.clients and auth.tokensSecretName (clients' bearer tokens pass through), terminating TLS %s" .who .what (ternary ", and asks for client certificates" "" (.ctx.Values.tls.clientApi.requireClientCert | default false)) .tlsAt) }}
{{- end }}
{{- end }}

{{- define "conveyor.router.validate" -}}
{{- $r := .Values.router }}
{{- $catalog := include "conveyor.router.catalog" . | fromYaml }}
{{- if not (hasKey $catalog (toString $r.type)) }}
{{- fail (printf "router.type must be vllm-router or sglang-router, not %q" (toString $r.type)) }}
{{- end }}
{{- $router := index $catalog $r.type }}
{{- if and (eq $r.type "vllm-router") (eq (toString $r.policy) "kv_aware") }}
{{- fail (printf "router.policy kv_aware routes on the KV-cache events vLLM workers publish (ZMQ), which Conveyor does not: use one of %s" (join ", " $router.policies)) }}
{{- end }}
{{- if not (has (toString $r.policy) $router.policies) }}
{{- fail (printf "router.policy %q is not a %s policy: use one of %s" (toString $r.policy) $r.type (join ", " $router.policies)) }}
{{- end }}
{{- if not (has (toString $r.logLevel) $router.logLevels) }}
{{- fail (printf "router.logLevel %q is not a %s log level: use one of %s" (toString $r.logLevel) $r.type (join ", " $router.logLevels)) }}
{{- end }}
{{- include "conveyor.validateRoutedHttp" (dict "ctx" . "who" "router.enabled" "what" $r.type "tlsAt" "in front of the router") }}
{{- $port := include "conveyor.port" (dict "name" "router.port" "port" $r.port) }}
{{- $metrics := include "conveyor.port" (dict "name" "router.metricsPort" "port" $r.metricsPort) }}
{{- if eq $port $metrics }}
{{- fail "router.port and router.metricsPort must differ" }}
{{- end }}
{{- if lt (int $r.replicas) 1 }}
{{- fail "router.replicas must be at least 1" }}
{{- end }}
{{- if lt (int $r.healthCheckIntervalS) 1 }}
{{- fail "router.healthCheckIntervalS must be at least 1 (seconds)" }}
{{- end }}
{{- end }}

{{/*
The endpoint picker (EPP) of the InferencePool: Gateway API Inference Extension's reference
implementation, whose ports are fixed here (ext-proc gRPC, gRPC health, metrics).
*/}}
{{- define "conveyor.epp.name" -}}
{{- printf "%s-epp" (include "conveyor.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "conveyor.epp.grpcPort" -}}9002{{- end }}
{{- define "conveyor.epp.healthPort" -}}9003{{- end }}
{{- define "conveyor.epp.metricsPort" -}}9090{{- end }}

{{- define "conveyor.inferencePool.validate" -}}
{{- include "conveyor.validateRoutedHttp" (dict "ctx" . "who" "inferencePool.enabled" "what" "the gateway (and the endpoint picker, scraping /metrics)" "tlsAt" "at the Gateway") }}
{{- if not (has (toString .Values.inferencePool.failureMode) (list "FailOpen" "FailClose")) }}
{{- fail (printf "inferencePool.failureMode must be FailOpen or FailClose, not %q" (toString .Values.inferencePool.failureMode)) }}
{{- end }}
{{- /* The picker passes Conveyor's metric names as flags, which releases from v1.5.0 refuse
at start (docs/scaling.md). A tag that is no version (a digest, a build of one's own) is
taken as it is. */}}
{{- $tag := toString .Values.inferencePool.epp.image.tag }}
{{- if and (regexMatch "^v?[0-9]+[.][0-9]+[.][0-9]+" $tag) (semverCompare ">=1.5.0-0" $tag) }}
{{- fail (printf "inferencePool.epp.image.tag %s: endpoint pickers from v1.5.0 refuse the metric-name flags the chart passes them (they take the names in their config file's engineConfigs instead, docs/scaling.md); use v1.3.0" $tag) }}
{{- end }}
{{- end }}

{{/* The model's name in the APIs: model.servedName, else the last part of model.path (what
the scheduler defaults --served_model_name to). */}}
{{- define "conveyor.servedModelName" -}}
{{- .Values.model.servedName | default (base .Values.model.path) -}}
{{- end }}
