{{/* The chart name, overridable. */}}
{{- define "meshnet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name, trimmed to a DNS label. */}}
{{- define "meshnet.fullname" -}}
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

{{/* chart-version label value. */}}
{{- define "meshnet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod (never change them after install). */}}
{{- define "meshnet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meshnet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "meshnet.labels" -}}
helm.sh/chart: {{ include "meshnet.chart" . }}
{{ include "meshnet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meshnet
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "meshnet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "meshnet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag or @digest; the tag defaults to appVersion. */}}
{{- define "meshnet.image" -}}
{{- $repo := .Values.image.repository }}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" .Values.image.registry $repo }}{{ end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repo .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The operator's permissions inside a watched namespace (or cluster-wide). */}}
{{- define "meshnet.namespacedRules" -}}
# ShardRoutes: watched, finalised and annotated by kopf; status written by the operator.
- apiGroups: [meshnet.dev]
  resources: [shardroutes]
  verbs: [get, list, watch, patch]
- apiGroups: [meshnet.dev]
  resources: [shardroutes/status]
  verbs: [patch]
# ModelArtifacts: read to wait for Ready and to learn digest, block count and storage
# (get: the Tracker report's architecture and block count, and a fresh read per
# provisioning reconcile); provisioned by the operator (patch: kopf's finalizer and
# progress annotations; status: conditions, manifestDigest, GGUF facts, node copies).
- apiGroups: [meshnet.dev]
  resources: [modelartifacts]
  verbs: [get, list, watch, patch]
- apiGroups: [meshnet.dev]
  resources: [modelartifacts/status]
  verbs: [patch]
# One worker pod per stage, a headless Service per route, and its gateway (a Deployment
# and a ClusterIP Service); a Measured route's probe agents (one pod per stage node).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, create, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Jobs: a route lane's certification Job, a Measured route's measuring Job, and each
# ModelArtifact's provisioning Jobs
# (their pods, read through `pods: list, watch`, report what the pull verified).
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete]
# The artifact spec a provisioning Job reads (an immutable ConfigMap per spec).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [list, watch, create, delete]
# Each route's identity Secret (its own CA, the stage, gateway, certification and operator
# certificates, the route key): issued, renewed (patch), read back; deleted with the route
# by its owner reference; a Measured route's probe token.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, create, patch]
# Each route's NetworkPolicy in front of its stage pods.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
{{- end }}
