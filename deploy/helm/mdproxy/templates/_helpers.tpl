{{/* The chart's name, or nameOverride. */}}
{{- define "mdproxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' base name: fullnameOverride, else the release's name when it holds the
chart's, else release-chart. 57 characters at most, so that "-admin" and "-redis" fit
Kubernetes' 63.
*/}}
{{- define "mdproxy.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 57 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "mdproxy.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "mdproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The selector of mdproxy's Pods (never Redis's). */}}
{{- define "mdproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mdproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: mdproxy
{{- end }}

{{/* The selector of the chart's Redis Pod. */}}
{{- define "mdproxy.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "mdproxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{/* The Secret that holds the chart's Redis password (key: redis.auth.key). */}}
{{- define "mdproxy.redisSecret" -}}
{{- default (printf "%s-redis" (include "mdproxy.fullname" .)) .Values.redis.auth.existingSecret }}
{{- end }}

{{/* Whether the replicas share a Redis: the chart's or one of your own. */}}
{{- define "mdproxy.sharedRedis" -}}
{{- if or .Values.redis.enabled .Values.redis.external.existingSecret }}true{{ end }}
{{- end }}

{{/*
The variables the chart sets from its typed values: in values.env they would be set
twice, so they are refused there, naming the value to use.
*/}}
{{- define "mdproxy.typedVariables" -}}
MDPROXY_UPSTREAM_URL: upstreamURL
MDPROXY_LISTEN_ADDR: ports.api
MDPROXY_ADMIN_ADDR: ports.admin
MDPROXY_BRIDGE_LISTEN_ADDR: ports.callback
MDPROXY_BRIDGE_CALLBACK_URL: "ports.callback (the Pod's own address)"
MDPROXY_BRIDGE: bridge.enabled
MDPROXY_SHUTDOWN_DELAY: shutdown.delaySeconds
MDPROXY_SHUTDOWN_TIMEOUT: shutdown.timeoutSeconds
MDPROXY_LIMITS_FILE: limits
MDPROXY_REDIS_URL: "redis.enabled or redis.external"
MDPROXY_REPLICAS: replicaCount
MDPROXY_REDIS_PREFIX: redis.prefix
MDPROXY_REDIS_TIMEOUT: redis.timeout
{{- end }}

{{/* Fails the render on values that cannot work, naming the value. */}}
{{- define "mdproxy.validate" -}}
{{- $typed := include "mdproxy.typedVariables" . | fromYaml }}
{{- range $name, $_ := .Values.env }}
{{- if not (hasPrefix "MDPROXY_" $name) }}
{{- fail (printf "env.%s: only MDPROXY_ variables belong in env (GOMEMLIMIT is goMemLimit; other variables: extraEnv)" $name) }}
{{- end }}
{{- if hasKey $typed $name }}
{{- fail (printf "env.%s: set by the chart from %s; set that value instead" $name (get $typed $name)) }}
{{- end }}
{{- end }}
{{- range $name, $_ := .Values.secretEnv }}
{{- if or (not (hasPrefix "MDPROXY_" $name)) (hasKey $.Values.env $name) (hasKey $typed $name) }}
{{- fail (printf "secretEnv.%s: want an MDPROXY_ variable set nowhere else (MDPROXY_REDIS_URL: redis.external)" $name) }}
{{- end }}
{{- end }}
{{- range $name, $_ := .Values.limits }}
{{- if not (hasPrefix "MDPROXY_" $name) }}
{{- fail (printf "limits.%s: want MDPROXY_<ROUTE>_<SETTING> route limit variables only" $name) }}
{{- end }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.external.existingSecret }}
{{- fail "redis.enabled and redis.external.existingSecret: choose one Redis" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not (include "mdproxy.sharedRedis" .)) }}
{{- fail (printf "replicaCount %d: replicas without Redis each let a route's whole rate through; set redis.enabled=true or redis.external.existingSecret, or replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}
{{- if lt (int .Values.replicaCount) 1 }}
{{- fail "replicaCount: want 1 or more" }}
{{- end }}
{{- end }}
