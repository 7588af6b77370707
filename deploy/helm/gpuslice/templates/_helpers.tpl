{{- define "gpuslice.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "gpuslice.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuslice.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* The DRA plugin's pods: a name of their own, so that neither the device
plugin's DaemonSet nor the metrics Service selects them. */}}
{{- define "gpuslice.dra.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-dra
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuslice.dra.labels" -}}
{{ include "gpuslice.dra.selector" . }}
app.kubernetes.io/component: dra-kubelet-plugin
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The device plugin and the DRA driver would hand out the same GPUs
twice: on the same nodes only one of them. */}}
{{- define "gpuslice.checkModes" -}}
{{- if and .Values.devicePlugin.enabled .Values.dra.enabled (not .Values.dra.nodeAffinity) -}}
{{- fail "devicePlugin.enabled and dra.enabled on the same nodes would hand out each GPU twice: set devicePlugin.enabled=false, or give the DRA driver other nodes with dra.nodeAffinity" -}}
{{- end -}}
{{- end -}}
