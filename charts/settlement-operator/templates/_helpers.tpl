{{/*
The name prefix of every object. With the release named settlement-operator (the
README's command) the objects have the names config/default gives them, so an install
made with either can be read with the same docs and runbook.
*/}}
{{- define "so.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "so.serviceAccountName" -}}
{{- include "so.fullname" . }}-controller-manager
{{- end -}}

{{/* Labels on every object. */}}
{{- define "so.labels" -}}
app.kubernetes.io/name: settlement-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The manager Pods' selector: config/manager's control-plane label, plus the release,
so two releases in one namespace (tenants sharded with --watch-namespaces) never
select each other's Pods.
*/}}
{{- define "so.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "so.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The namespace of `helm test`'s WebhookProvider: one the release serves. The release
namespace when it serves every namespace or lists it in controllers.watchNamespaces,
else the first namespace listed (a receiver answers 404 for a namespace it does not
serve).
*/}}
{{- define "so.testNamespace" -}}
{{- $watched := splitList "," .Values.controllers.watchNamespaces | compact -}}
{{- if or (not $watched) (has .Release.Namespace $watched) -}}
{{- .Release.Namespace -}}
{{- else -}}
{{- first $watched -}}
{{- end -}}
{{- end -}}

{{/*
The metrics Service: config/default's name, <fullname>-controller-manager-metrics-service,
while it is a valid Service name (63 characters at most), else <fullname>-metrics; a
longer name would make the whole install fail.
*/}}
{{- define "so.metricsServiceName" -}}
{{- $long := printf "%s-controller-manager-metrics-service" (include "so.fullname" .) -}}
{{- if le (len $long) 63 -}}
{{- $long -}}
{{- else -}}
{{- include "so.fullname" . }}-metrics
{{- end -}}
{{- end -}}
