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

{{/* Whether the controller serves an admission webhook: the conversion, the config check, or both. */}}
{{- define "tessera.webhook.enabled" -}}
{{- $controller := .Values.controller }}
{{- if and $controller.enabled (or $controller.devicePluginConversion.enabled $controller.configValidation.enabled) }}true{{ end }}
{{- end }}

{{/* The admission webhook's Service, Secret (<name>-certificates) and configurations. */}}
{{- define "tessera.webhook.name" -}}
{{- printf "%s-webhook" (include "tessera.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The plugin's service account: serviceAccount.name, else the plugin's name. */}}
{{- define "tessera.kubeletPlugin.serviceAccountName" -}}
{{- default (include "tessera.kubeletPlugin.name" .) .Values.kubeletPlugin.serviceAccount.name }}
{{- end }}

{{/* The controller's service account: serviceAccount.name, else the controller's name. */}}
{{- define "tessera.controller.serviceAccountName" -}}
{{- default (include "tessera.controller.name" .) .Values.controller.serviceAccount.name }}
{{- end }}

{{/* The user name the API server gives the plugin's service-account tokens. */}}
{{- define "tessera.kubeletPlugin.userName" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tessera.kubeletPlugin.serviceAccountName" .) }}
{{- end }}

{{/* The user name the API server gives the controller's service-account tokens. */}}
{{- define "tessera.controller.userName" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "tessera.controller.serviceAccountName" .) }}
{{- end }}

{{/*
The NVIDIA driver root of the whole chart: `nvidiaDriverRoot` (the name NVIDIA's chart uses), or
`kubeletPlugin.driverRoot` (this chart's older name, still read). Both set and different is an
error rather than a guess.
*/}}
{{- define "tessera.driverRoot" -}}
{{- $new := .Values.nvidiaDriverRoot }}
{{- $old := .Values.kubeletPlugin.driverRoot }}
{{- if and $new $old (ne $new $old) }}
{{- fail (printf "nvidiaDriverRoot (%s) and kubeletPlugin.driverRoot (%s) differ: set only nvidiaDriverRoot (kubeletPlugin.driverRoot is its older name)" $new $old) }}
{{- end }}
{{- default $old $new }}
{{- end }}

{{/*
A container securityContext: the chart's (a YAML dict in .base) with the user's overrides
(.overrides) merged over it key by key.
*/}}
{{- define "tessera.securityContext" -}}
{{- $base := .base | fromYaml }}
{{- toYaml (mergeOverwrite $base (deepCopy (.overrides | default dict))) }}
{{- end }}

{{- define "tessera.controller.leaseNamespace" -}}
{{- default .Release.Namespace .Values.controller.leaderElection.leaseNamespace }}
{{- end }}

{{/*
The plugin DaemonSets to render: one per entry of kubeletPlugin.nodeGroups, or a single one from
kubeletPlugin.nodeSelector and kubeletPlugin.mock.topology. Returned as YAML ({groups: [...]}),
each group with name (the DaemonSet name), nodeSelector, topology and its host paths:
registrar, plugins (the kubelet's plugins_registry/ and plugins/ directories), cdiRoot and
stateDir, driverRoot, devRoot, consumableShares and dynamicMig (the group's, else
featureGates.DynamicMIG). A group's own value wins; a group that sets only kubeletRootDir gets that root's
plugins_registry/ and plugins/; otherwise the top-level values apply, where empty directory paths
mean <kubeletRootDir>/plugins_registry and <kubeletRootDir>/plugins.
*/}}
{{- define "tessera.kubeletPlugin.groups" -}}
{{- $plugin := .Values.kubeletPlugin }}
{{- $base := include "tessera.kubeletPlugin.name" . }}
{{- $ := . }}
{{- $topRoot := trimSuffix "/" $plugin.kubeletRootDir }}
{{- $topRegistrar := default (printf "%s/plugins_registry" $topRoot) $plugin.kubeletRegistrarDirectoryPath }}
{{- $topPlugins := default (printf "%s/plugins" $topRoot) $plugin.kubeletPluginsDirectoryPath }}
{{- $groups := list }}
{{- $entries := $plugin.nodeGroups }}
{{- if not $entries }}
{{- $entries = list (dict "nodeSelector" $plugin.nodeSelector) }}
{{- end }}
{{- range $entries }}
{{- $name := $base }}
{{- if .name }}
{{- $name = printf "%s-%s" $base .name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- $registrar := $topRegistrar }}
{{- $plugins := $topPlugins }}
{{- if .kubeletRootDir }}
{{- $registrar = printf "%s/plugins_registry" (trimSuffix "/" .kubeletRootDir) }}
{{- $plugins = printf "%s/plugins" (trimSuffix "/" .kubeletRootDir) }}
{{- end }}
{{- $registrar = default $registrar .kubeletRegistrarDirectoryPath }}
{{- $plugins = default $plugins .kubeletPluginsDirectoryPath }}
{{- $groups = append $groups (dict "name" $name "nodeSelector" .nodeSelector "topology" (default $plugin.mock.topology .topology) "registrar" $registrar "plugins" $plugins "cdiRoot" (default $plugin.cdiRoot .cdiRoot) "stateDir" (default $plugin.stateDir .stateDir) "driverRoot" (default (include "tessera.driverRoot" $) .driverRoot) "devRoot" (default $plugin.devRoot .devRoot) "consumableShares" (toString (dig "sharing" "consumableShares" $plugin.sharing.consumableShares .)) "dynamicMig" (ternary .dynamicMig $.Values.featureGates.DynamicMIG (hasKey . "dynamicMig"))) }}
{{- end }}
{{- toYaml (dict "groups" $groups) }}
{{- end }}
