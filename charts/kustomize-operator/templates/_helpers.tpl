{{/*
Names and labels shared by the templates, and the checks of the values.
*/}}

{{/*
The prefix of every object's name, cluster-scoped ones included: the release
name when it contains the chart's name (a release `kustomize-operator` gives
the names of deploy/), else `<release>-kustomize-operator`. Two releases thus
never share a ClusterRole or ClusterRoleBinding.
*/}}
{{- define "kustomize-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of the operator and of the kubectl it runs. */}}
{{- define "kustomize-operator.serviceAccountName" -}}
{{- include "kustomize-operator.fullname" . -}}
{{- end -}}

{{/*
Selector labels: deploy/'s `app.kubernetes.io/name` and the release. They
are immutable in a Deployment's selector.
*/}}
{{- define "kustomize-operator.selectorLabels" -}}
app.kubernetes.io/name: kustomize-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object: the selector labels and Helm's usual ones. */}}
{{- define "kustomize-operator.labels" -}}
{{ include "kustomize-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The operator's ServiceAccount as a binding's subject. */}}
{{- define "kustomize-operator.subjects" -}}
subjects:
  - kind: ServiceAccount
    name: {{ include "kustomize-operator.serviceAccountName" . }}
    namespace: {{ .Release.Namespace }}
{{- end -}}

{{/* Every kind the operator knows, as in --kinds (values.schema.json lists them too). */}}
{{- define "kustomize-operator.allKinds" -}}
exchangerate,chaosagent,copyrator,sample
{{- end -}}

{{/*
The kinds that run when `kinds` is empty: all of them (empty), or, locked
down, those whose writes can run as the tenant.
*/}}
{{- define "kustomize-operator.defaultKinds" -}}
{{- if .Values.writeAs.lockedDown }}sample,exchangerate,copyrator{{ end -}}
{{- end -}}

{{/*
"true" when the release serves KindDefinitions (and grants the CRD rights
they take): always, but locked down only with writeAs.kindDefinitions, as
overlays/locked-down and its component kind-definitions/.
*/}}
{{- define "kustomize-operator.servesKindDefinitions" -}}
{{- if or (not .Values.writeAs.lockedDown) .Values.writeAs.kindDefinitions -}}true{{- end -}}
{{- end -}}

{{/*
"true" when the kind given as `kind` runs: `kinds` is empty or lists it.
Usage: include "kustomize-operator.runs" (dict "root" . "kind" "sample")
*/}}
{{- define "kustomize-operator.runs" -}}
{{- $kinds := .root.Values.kinds | default (include "kustomize-operator.defaultKinds" .root | splitList "," | compact) -}}
{{- if or (empty $kinds) (has .kind $kinds) -}}true{{- end -}}
{{- end -}}

{{/*
Checks of the values that a schema cannot express; renders nothing, fails
with a message naming the value.
*/}}
{{- define "kustomize-operator.validate" -}}
{{- $all := splitList "," (include "kustomize-operator.allKinds" .) -}}
{{- range .Values.kinds -}}
{{- if not (has . $all) -}}
{{- fail (printf "kinds: unknown kind %q; known kinds: %s" . (join ", " $all)) -}}
{{- end -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) (not .Values.autoSharding.enabled) -}}
{{- fail (printf "replicas: %d replicas need leaderElection.enabled=true or autoSharding.enabled=true (each would run the controllers on every resource)" (int .Values.replicas)) -}}
{{- end -}}
{{- if and .Values.autoSharding.enabled .Values.leaderElection.enabled -}}
{{- fail "autoSharding.enabled replaces leader election: set leaderElection.enabled=false" -}}
{{- end -}}
{{- if and .Values.writeAs.lockedDown (not .Values.writeAs.serviceAccountName) -}}
{{- fail "writeAs.lockedDown needs writeAs.serviceAccountName: the account of each namespace that writes for its resources" -}}
{{- end -}}
{{- if and .Values.writeAs.kindDefinitions (not .Values.writeAs.lockedDown) -}}
{{- fail "writeAs.kindDefinitions is for writeAs.lockedDown: other installs serve KindDefinitions anyway" -}}
{{- end -}}
{{- if and .Values.writeAs.clusterServiceAccount (not .Values.writeAs.serviceAccountName) -}}
{{- fail "writeAs.clusterServiceAccount needs writeAs.serviceAccountName: without it every write runs as the operator's own account" -}}
{{- end -}}
{{- if and .Values.writeAs.lockedDown (has "chaosagent" .Values.kinds) -}}
{{- fail "kinds: chaosagent acts as the operator itself and cannot run with writeAs.lockedDown" -}}
{{- end -}}
{{- if and .Values.copyratorNamespaces (not (include "kustomize-operator.runs" (dict "root" . "kind" "copyrator"))) -}}
{{- fail "copyratorNamespaces is set but copyrator is not among kinds" -}}
{{- end -}}
{{- if ne (len .Values.copyratorNamespaces) (len (uniq .Values.copyratorNamespaces)) -}}
{{- fail (printf "copyratorNamespaces lists a namespace twice: %s" (join "," .Values.copyratorNamespaces)) -}}
{{- end -}}
{{- if and .Values.conversionWebhook.enabled (not (include "kustomize-operator.servesKindDefinitions" .)) -}}
{{- fail "conversionWebhook.enabled serves KindDefinitions of several versions, and this release serves no KindDefinitions (writeAs.lockedDown without writeAs.kindDefinitions)" -}}
{{- end -}}
{{- $fromValues := dict "DEFAULT_SERVICE_ACCOUNT" "writeAs.serviceAccountName" "KINDS" "kinds" "WATCH_NAMESPACE" "watchNamespace" "COPYRATOR_NAMESPACES" "copyratorNamespaces" "LEADER_ELECT" "leaderElection.enabled" "NAMESPACE" "the release's namespace" "POD_NAME" "the Pod's name" "SHARD" "shard" "SERVE_KIND_DEFINITIONS" "writeAs.lockedDown and writeAs.kindDefinitions" "CLUSTER_SERVICE_ACCOUNT" "writeAs.clusterServiceAccount" "CONVERSION_WEBHOOK_ADDR" "conversionWebhook.enabled" "CONVERSION_WEBHOOK_SERVICE" "conversionWebhook.enabled" "CONVERSION_WEBHOOK_SECRET" "conversionWebhook.enabled" -}}
{{- range .Values.extraEnv -}}
{{- if hasKey $fromValues .name -}}
{{- fail (printf "extraEnv: %s is set by the chart from %s" .name (get $fromValues .name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The label that aggregates a declared kind's ClusterRole into `<fullname>-kinds`
(the one `kustomize-operator rbac` prints). It is cluster-wide: every release's
`-kinds` role, and deploy/'s, selects every role that carries it.
*/}}
{{- define "kustomize-operator.aggregateLabel" -}}
kustomize-operator.io/aggregate-to-operator: "true"
{{- end -}}

{{/*
A ClusterRoleBinding of the ClusterRole `<fullname>-<role>` to the operator's
ServiceAccount, under the same name.
Usage: include "kustomize-operator.clusterRoleBinding" (dict "root" . "role" "sample")
*/}}
{{- define "kustomize-operator.clusterRoleBinding" -}}
{{- $name := printf "%s-%s" (include "kustomize-operator.fullname" .root) .role -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- include "kustomize-operator.labels" .root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name }}
{{ include "kustomize-operator.subjects" .root }}
{{- end -}}

{{/*
The operator's environment (its flags: docs/command-line.md), in
the order of the values' variables, then deploy/operator/deployment.yaml's.
*/}}
{{/* The Lease: kustomize-operator, or kustomize-operator-<shard> for a shard. */}}
{{/*
NetworkPolicyPeers for any address but the link-local ranges (cloud
metadata services): the API server's and the collector's when no address
is given.
*/}}
{{- define "kustomize-operator.anyAddress" -}}
- ipBlock:
    cidr: 0.0.0.0/0
    except: [169.254.0.0/16]
- ipBlock:
    cidr: ::/0
    except: ["fe80::/10"]
{{- end -}}

{{- define "kustomize-operator.leaseName" -}}
{{- if .Values.shard }}kustomize-operator-{{ .Values.shard }}{{ else }}kustomize-operator{{ end }}
{{- end }}

{{- define "kustomize-operator.env" -}}
# What the values set first (where kustomize's patches put it, so the chart
# and overlays/copyrator-namespaces render alike).
{{- with .Values.kinds | default (include "kustomize-operator.defaultKinds" . | splitList "," | compact) }}
- name: KINDS
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.watchNamespace }}
- name: WATCH_NAMESPACE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.copyratorNamespaces }}
- name: COPYRATOR_NAMESPACES
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.shard }}
- name: SHARD
  value: {{ . | quote }}
{{- end }}
{{- with .Values.writeAs.serviceAccountName }}
- name: DEFAULT_SERVICE_ACCOUNT
  value: {{ . | quote }}
{{- end }}
{{- if not (include "kustomize-operator.servesKindDefinitions" .) }}
- name: SERVE_KIND_DEFINITIONS
  value: "false"
{{- end }}
{{- if .Values.autoSharding.enabled }}
- name: AUTO_SHARD
  value: "true"
{{- end }}
{{- with .Values.writeAs.clusterServiceAccount }}
- name: CLUSTER_SERVICE_ACCOUNT
  value: {{ . | quote }}
{{- end }}
# The operator's namespace, from the downward API: the Lease lives here.
- name: NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
# The replica's name in the Lease and in the Events it reports.
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- if .Values.leaderElection.enabled }}
- name: LEADER_ELECT
  value: "true"
{{- end }}
- name: METRICS_ADDR
  value: "0.0.0.0:8080"
# Temporary overlays and kubectl's discovery cache (KUSTOMIZE_DIR and KUBECTL
# are set by the image).
- name: WORK_DIR
  value: /tmp/kustomize-operator
- name: MAX_CONCURRENT_KUBECTL
  value: "4"
- name: KUBECTL_TIMEOUT
  value: 60s
- name: LOG_FORMAT
  value: json
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: RUST_LOG
  value: info
{{- if .Values.conversionWebhook.enabled }}
{{- $webhook := printf "%s-webhook" (include "kustomize-operator.fullname" .) }}
- name: CONVERSION_WEBHOOK_ADDR
  value: "0.0.0.0:9443"
- name: CONVERSION_WEBHOOK_SERVICE
  value: {{ printf "%s/%s:443" .Release.Namespace $webhook | quote }}
- name: CONVERSION_WEBHOOK_SECRET
  value: {{ $webhook }}
{{- end }}
{{- end -}}
