{{- define "raypod.fullname" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "raypod.labels" -}}
app.kubernetes.io/name: raypod
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "raypod.selector" -}}
app.kubernetes.io/name: raypod
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "raypod.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "raypod.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Exactly the verbs raypod's Kubernetes backend uses (src/raypod/backends/kuberay/backend.py). */}}
{{- define "raypod.rules" -}}
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: ["ray.io"]
  resources: ["rayservices"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "delete"]
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
{{- end -}}
