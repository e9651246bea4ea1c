{{/* The app's name: the chart's, unless nameOverride. */}}
{{- define "spot-autoscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: release "spot-autoscaler" gives the names deploy/ uses. */}}
{{- define "spot-autoscaler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "spot-autoscaler.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels kustomize's objects lack (the chart and kustomize comparison ignores them). */}}
{{- define "spot-autoscaler.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* What selects a component's pods: deploy/'s selector, plus the release. Args: ctx, component. */}}
{{- define "spot-autoscaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spot-autoscaler.name" .ctx }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{/*
metadata: of an object. Args (a dict): ctx (the root), name, namespace (omit for a cluster-scoped
object), component, labels (more labels), annotations (more annotations), bare (true: no
app.kubernetes.io/name, as deploy/monitoring's dashboard ConfigMap).
*/}}
{{- define "spot-autoscaler.metadata" -}}
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- if not .bare }}
    app.kubernetes.io/name: {{ include "spot-autoscaler.name" .ctx }}
    {{- end }}
    {{- with .component }}
    app.kubernetes.io/component: {{ . }}
    {{- end }}
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- include "spot-autoscaler.helmLabels" .ctx | nindent 4 }}
  {{- with merge (dict) (.annotations | default dict) .ctx.Values.commonAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "spot-autoscaler.serviceAccountName" -}}
{{- include "spot-autoscaler.fullname" . -}}
{{- end -}}

{{- define "spot-autoscaler.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "spot-autoscaler.metricsPort" -}}
{{- dig "daemon" "metrics_port" 9090 .Values.config | int -}}
{{- end -}}

{{- define "spot-autoscaler.leaderElection" -}}
{{- toJson (dig "daemon" "leader_election" dict .Values.config) -}}
{{- end -}}

{{/* Where the Lease and its Role live: leader_election.lease_namespace, else the release's. */}}
{{- define "spot-autoscaler.leaseNamespace" -}}
{{- $election := include "spot-autoscaler.leaderElection" . | fromJson -}}
{{- $election.lease_namespace | default .Release.Namespace -}}
{{- end -}}

{{- define "spot-autoscaler.leaseName" -}}
{{- $election := include "spot-autoscaler.leaderElection" . | fromJson -}}
{{- $election.lease_name | default (include "spot-autoscaler.fullname" .) -}}
{{- end -}}

{{- define "spot-autoscaler.leaderElectionEnabled" -}}
{{- $election := include "spot-autoscaler.leaderElection" . | fromJson -}}
{{- if or (not (hasKey $election "enabled")) $election.enabled }}true{{ end -}}
{{- end -}}

{{/* Fails when section.lo > section.hi, both numbers (the config model's rule). Args: key, section, lo, hi. */}}
{{- define "spot-autoscaler.ordered" -}}
{{- $section := .section | default dict -}}
{{- $lo := get $section .lo -}}
{{- $hi := get $section .hi -}}
{{- if and (regexMatch "^(float64|int64|int)$" (kindOf $lo)) (regexMatch "^(float64|int64|int)$" (kindOf $hi)) -}}
{{- if gt (float64 $lo) (float64 $hi) -}}
{{- fail (printf "%s: %s %v > %s %v" .key .lo $lo .hi $hi) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "true" when section.key is there and not null. Args: section, key. */}}
{{- define "spot-autoscaler.set" -}}
{{- if and (hasKey .section .key) (not (kindIs "invalid" (get .section .key))) }}true{{ end -}}
{{- end -}}

{{/*
The daemon's config.yaml: values' `config`, with eks/ack's cloud sections and the Lease's name.
What a template can check fails here, naming the key; `spot-autoscaler check-config` checks all.
*/}}
{{- define "spot-autoscaler.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $daemon := $config.daemon | default dict -}}
{{- if ne ($daemon.mode | default "kubernetes") "kubernetes" -}}
{{- fail (printf "config.daemon.mode: the chart runs the daemon in kubernetes mode, not %q" $daemon.mode) -}}
{{- end -}}
{{- $names := list -}}
{{- range $i, $policy := $config.policies | default list -}}
{{- if has $policy.name $names -}}
{{- fail (printf "config.policies[%d].name: %q names two policies" $i $policy.name) -}}
{{- end -}}
{{- $names = append $names $policy.name -}}
{{- $key := printf "config.policies[%d]" $i -}}
{{- include "spot-autoscaler.ordered" (dict "key" (printf "%s.limits" $key) "section" $policy.limits "lo" "min_workers" "hi" "max_workers") -}}
{{- include "spot-autoscaler.ordered" (dict "key" (printf "%s.on_demand" $key) "section" $policy.on_demand "lo" "min_on_demand" "hi" "max_on_demand") -}}
{{- range $j, $window := $policy.windows | default list -}}
{{- include "spot-autoscaler.ordered" (dict "key" (printf "%s.windows[%d].limits" $key $j) "section" $window.limits "lo" "min_workers" "hi" "max_workers") -}}
{{- end -}}
{{- with $policy.deadline -}}
{{- if eq (include "spot-autoscaler.set" (dict "section" . "key" "at")) (include "spot-autoscaler.set" (dict "section" . "key" "within")) -}}
{{- fail (printf "%s.deadline: set exactly one of deadline.at and deadline.within" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $config.default_policy (not (has $config.default_policy $names)) -}}
{{- fail (printf "config.default_policy: %q names no policy in config.policies (%s)" $config.default_policy (join ", " $names)) -}}
{{- end -}}
{{- if .Values.eks.enabled -}}
{{- if not .Values.eks.queueUrl -}}
{{- fail "eks.queueUrl: required with eks.enabled (the SQS queue EventBridge feeds; docs/cloud.md)" -}}
{{- end -}}
{{- $aws := dict "enabled" true "queue_url" .Values.eks.queueUrl "prices" .Values.eks.prices -}}
{{- with .Values.eks.region }}{{ $_ := set $aws "region" . }}{{ end -}}
{{- $_ := set $config "aws" (mergeOverwrite ($config.aws | default dict) $aws) -}}
{{- end -}}
{{- if .Values.ack.enabled -}}
{{- if not .Values.ack.region -}}
{{- fail "ack.region: required with ack.enabled (e.g. cn-hangzhou)" -}}
{{- end -}}
{{- $alibaba := dict "enabled" true "region" .Values.ack.region "poll_interval" .Values.ack.pollInterval "cloudmonitor" (dict "enabled" .Values.ack.cloudMonitor) "prices" .Values.ack.prices -}}
{{- $_ := set $config "alibaba" (mergeOverwrite ($config.alibaba | default dict) $alibaba) -}}
{{- end -}}
{{- if include "spot-autoscaler.leaderElectionEnabled" . -}}
{{- $election := $daemon.leader_election | default dict -}}
{{- $_ := set $election "lease_name" (include "spot-autoscaler.leaseName" .) -}}
{{- $_ := set $daemon "leader_election" $election -}}
{{- $_ := set $config "daemon" $daemon -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
