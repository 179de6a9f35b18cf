{{/* The chart's name, or nameOverride. */}}
{{- define "postbox.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of the release's objects: fullnameOverride, the release's
name when it already holds the chart's, or RELEASE-postbox. */}}
{{- define "postbox.fullname" -}}
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

{{/* Labels every object carries. */}}
{{- define "postbox.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "postbox.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels the Service and the ServiceMonitor select the pods by. */}}
{{- define "postbox.selectorLabels" -}}
app.kubernetes.io/name: {{ include "postbox.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The Secret holding the API token. */}}
{{- define "postbox.apiTokenSecret" -}}
{{- .Values.apiToken.existingSecret | default (printf "%s-api-token" (include "postbox.fullname" .)) }}
{{- end }}

{{/* The Secret holding --store and --streams in cluster mode. */}}
{{- define "postbox.clusterSecret" -}}
{{- .Values.cluster.existingSecret | default (printf "%s-cluster" (include "postbox.fullname" .)) }}
{{- end }}

{{/* Checks the values and fails with what is wrong. */}}
{{- define "postbox.validate" -}}
{{- if not (has .Values.mode (list "single" "cluster")) }}
{{- fail (printf "mode %q: use single (one node on SQLite) or cluster (nodes on PostgreSQL)" .Values.mode) }}
{{- end }}
{{- if not (has .Values.scheme (list "HTTP" "HTTPS")) }}
{{- fail (printf "scheme %q: use HTTP, or HTTPS when serve has --tls-cert" .Values.scheme) }}
{{- end }}
{{- if eq .Values.mode "cluster" }}
{{- if lt (int .Values.replicas) 1 }}
{{- fail (printf "replicas %v: cluster mode needs at least 1" .Values.replicas) }}
{{- end }}
{{- if not .Values.cluster.existingSecret }}
{{- if not (hasPrefix "postgres" .Values.cluster.store) }}
{{- fail "cluster mode: set cluster.store to postgres://user:PASSWORD@host:5432/db?schema=postbox, or cluster.existingSecret to a Secret holding it" }}
{{- end }}
{{- if not (or (hasPrefix "nats://" .Values.cluster.streams) (hasPrefix "kafka://" .Values.cluster.streams) (hasPrefix "postgres" .Values.cluster.streams)) }}
{{- fail (printf "cluster mode: cluster.streams %q: use nats://…, kafka://… or postgres://… (a shared backend; sqlite is one node's file), or cluster.existingSecret" .Values.cluster.streams) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* POSTBOX_ALLOWED_HOSTS: the Service's DNS names and allowedHosts. */}}
{{- define "postbox.allowedHosts" -}}
{{- $svc := include "postbox.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $hosts := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) }}
{{- concat $hosts .Values.allowedHosts | uniq | join "," }}
{{- end }}
