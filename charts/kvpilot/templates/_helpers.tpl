{{- define "kvpilot.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvpilot.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kvpilot.labels" -}}
{{ include "kvpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kvpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvpilot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvpilot.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* true when a watched namespace is a kopf glob pattern (needs cluster-wide RBAC) */}}
{{- define "kvpilot.hasGlob" -}}
{{- range .Values.watchNamespaces -}}
{{- if regexMatch "[*?\\[\\]!]" . -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/* "cluster" or "namespace": where the operator's namespaced permissions are granted */}}
{{- define "kvpilot.rbacScope" -}}
{{- $glob := include "kvpilot.hasGlob" . -}}
{{- if eq .Values.rbac.scope "cluster" -}}cluster
{{- else if eq .Values.rbac.scope "namespace" -}}
{{- if not .Values.watchNamespaces -}}
{{- fail "rbac.scope=namespace needs watchNamespaces (the namespaces that get a Role); leave it empty only with rbac.scope=cluster or auto" -}}
{{- end -}}
{{- if $glob -}}
{{- fail (printf "rbac.scope=namespace cannot grant a glob in watchNamespaces %v (a Role needs a namespace that exists now); use exact names or rbac.scope=cluster" .Values.watchNamespaces) -}}
{{- end -}}
namespace
{{- else if or (not .Values.watchNamespaces) $glob -}}cluster
{{- else -}}namespace
{{- end -}}
{{- end -}}

{{/* the namespaces that get a Role in namespaced mode: the watched ones, and the Gateway's */}}
{{- define "kvpilot.roleNamespaces" -}}
{{- $ns := list -}}
{{- range .Values.watchNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- if and .Values.gateway.namespace (not (has .Values.gateway.namespace $ns)) -}}
{{- $ns = append $ns .Values.gateway.namespace -}}
{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* Rules on namespaced resources: in a ClusterRole (scope cluster) or a Role per watched namespace.
     docs/install.md lists which code uses each verb. */}}
{{- define "kvpilot.namespacedRules" -}}
# InferenceServices: kopf watches them and keeps its progress in annotations (patch); the status writer.
- apiGroups: [kvpilot.io]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
- apiGroups: [kvpilot.io]
  resources: [inferenceservices/status]
  verbs: [get, patch]
# Children by server-side apply: a PATCH that creates the object is authorised as create too.
# kopf watches the Deployments; the canary's Deployment and Service are deleted after a rollout.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, create, patch, delete]
# The lineage ConfigMap (get, apply), model configs (configMapRef) and probe sets (get).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
{{- if or .Values.rbac.readApiKeySecrets .Values.rbac.readModelSecrets }}
# The probe gate reads the engine's API key (spec.engine.apiKeySecretRef) when it scores a probe
# set (readApiKeySecrets); the preflight reads a model source's login to fetch its config.json
# (spec.model.credentialsSecretRef, readModelSecrets). RBAC cannot narrow this to the Secrets that
# specs name: it is `get` on every Secret here.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end }}
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [get, create, patch]
# A PodDisruptionBudget per track (server-side apply; deleted with the canary, or when
# spec.disruptionBudget.enabled is false).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# spec.autoscaling: an HPA per track (server-side apply; deleted when autoscaling is off or the
# canary goes).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, create, patch, delete]
# --router inference-pool: an InferencePool per track (Gateway API Inference Extension v1).
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, create, patch]
# The rollout's traffic split.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [gateway.networking.k8s.io]
  resources: [gateways]
  verbs: [get, list, watch]
# kopf.event and kopf's own warnings (create); the pods' own Events (FailedMount) and the pods
# themselves for the PodsBlocked condition and the canary's crash check (get, list, watch).
- apiGroups: [""]
  resources: [events]
  verbs: [create, get, list]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
{{- if .Values.peering.enabled }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}

{{/* Cluster-scoped reads: CRDs (kopf's resource observer; the Prometheus Operator and Gateway API
     checks), namespaces (kopf resolves the watched namespaces and glob patterns at start; without
     it, it retries 9 times before falling back to the names given), the cluster peering when all
     namespaces are watched. */}}
{{- define "kvpilot.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- if ne .Values.canaryGpuCheck "off" }}
# The canary's GPU preflight: allocatable GPUs of matching nodes minus what the pods bound to them
# request, in every namespace (--canary-gpu-check).
- apiGroups: [""]
  resources: [nodes, pods]
  verbs: [list]
{{- end }}
{{- end -}}

{{- define "kvpilot.operatorArgs" -}}
- operator
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
{{- if .Values.peering.enabled }}
- --peering={{ .Values.peering.name }}
- --priority={{ .Values.priority }}
{{- else }}
- --standalone
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.liveness.port }}{{ .Values.liveness.path }}
{{- if .Values.metrics.enabled }}
- --metrics-port={{ .Values.metrics.port }}
{{- end }}
{{- with .Values.prometheus.url }}
- --prometheus-url={{ . }}
{{- end }}
{{- with .Values.gateway.name }}
- --gateway={{ . }}{{ with $.Values.gateway.namespace }}/{{ . }}{{ end }}
{{- end }}
{{- with .Values.gateway.url }}
- --gateway-url={{ . }}
{{- end }}
- --canary-gpu-check={{ .Values.canaryGpuCheck }}
{{- with .Values.gpuProductLabel }}
- --gpu-product-label={{ . }}
{{- end }}
{{- if .Values.verbose }}
- --verbose
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
