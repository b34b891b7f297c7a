{{- define "detshare.labels" -}}
app.kubernetes.io/name: detshare
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "detshare.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{- define "detshare.env" -}}
- name: DETSHARE_RUN_DIR
  value: {{ .Values.runDir | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "detshare.placement" -}}
hostNetwork: {{ .Values.hostNetwork }}
nodeSelector:
{{ toYaml .Values.nodeSelector | indent 2 }}
{{- with .Values.tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{- /* The host's limits on what a tenant pod may set itself beyond its allocation (both plugins). */ -}}
{{- define "detshare.limitArgs" -}}
"--max-weight", "{{ .Values.tenantLimits.maxWeight }}", "--allowed-roles", {{ join "," .Values.tenantLimits.allowedRoles | quote }}
{{- end -}}

{{- /* Critical Xid errors and the GPUs' health (both plugins). */ -}}
{{- define "detshare.healthArgs" -}}
"--xid-ignored", {{ .Values.gpuHealth.xidIgnored | quote }}, "--xid-hold", {{ .Values.gpuHealth.xidHold | quote }}
{{- end -}}

{{- /* A container that needs no privilege at all: no capabilities, no escalation, a read-only root. */ -}}
{{- define "detshare.unprivileged" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
