{{/* Chart name, overridable. */}}
{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, unless it already contains the chart name. */}}
{{- define "tessera.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tessera.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select this release's pods (add app.kubernetes.io/component per workload). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tessera.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "tessera.kubeletPlugin.name" -}}
{{- printf "%s-kubelet-plugin" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tessera.controller.name" -}}
{{- printf "%s-controller" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The user name the API server gives the plugin's service-account tokens. */}}
{{- define "tessera.kubeletPlugin.userName" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tessera.kubeletPlugin.name" .) }}
{{- end }}

{{- define "tessera.controller.leaseNamespace" -}}
{{- default .Release.Namespace .Values.controller.leaderElection.leaseNamespace }}
{{- end }}

{{/*
The plugin DaemonSets to render: one per entry of kubeletPlugin.nodeGroups, or a single one from
kubeletPlugin.nodeSelector and kubeletPlugin.mock.topology. Returned as YAML ({groups: [...]}),
each group with name (the DaemonSet name), nodeSelector and topology.
*/}}
{{- define "tessera.kubeletPlugin.groups" -}}
{{- $plugin := .Values.kubeletPlugin }}
{{- $base := include "tessera.kubeletPlugin.name" . }}
{{- $groups := list }}
{{- if $plugin.nodeGroups }}
{{- range $plugin.nodeGroups }}
{{- $groups = append $groups (dict "name" (printf "%s-%s" $base .name | trunc 63 | trimSuffix "-") "nodeSelector" .nodeSelector "topology" (default $plugin.mock.topology .topology) "driverRoot" (default $plugin.driverRoot .driverRoot) "devRoot" (default $plugin.devRoot .devRoot)) }}
{{- end }}
{{- else }}
{{- $groups = append $groups (dict "name" $base "nodeSelector" $plugin.nodeSelector "topology" $plugin.mock.topology "driverRoot" $plugin.driverRoot "devRoot" $plugin.devRoot) }}
{{- end }}
{{- toYaml (dict "groups" $groups) }}
{{- end }}
