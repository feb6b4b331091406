{{/*
The labels every object carries: Kubernetes' recommended labels and
Helm's chart label. Called with a dict: "root", the chart's context, and
"component", the part of Reaper the object is (identity, rbac,
admission-policy, flow-control). No selector reads them: the chart runs
no workload.
*/}}
{{- define "reaper.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: reaper
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
The release's namespace, which holds Reaper's ServiceAccount: the
admission policy and the FlowSchema cover every ServiceAccount of it, so
it must be Reaper's alone. Refused: a name that is not a namespace's (it is
written into CEL string literals), and the namespaces others share:
"default", where anyone deploying there could mount Reaper's token, and
kube-system, kube-public and kube-node-lease, whose controllers' own Pod
status writes the policy would then refuse.
*/}}
{{- define "reaper.namespace" -}}
{{- $ns := .Release.Namespace -}}
{{- if not (and (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" $ns) (le (len $ns) 63)) }}
{{- fail (printf "release namespace %q is not a namespace name (RFC 1123 label)" $ns) }}
{{- end }}
{{- if has $ns (list "default" "kube-system" "kube-public" "kube-node-lease") }}
{{- fail (printf "release namespace %q: Reaper's ServiceAccount needs a namespace of its own, as the admission policy and the FlowSchema cover every ServiceAccount of it; install with -n reaper --create-namespace" $ns) }}
{{- end }}
{{- $ns }}
{{- end }}

{{/*
A CEL string literal of a value: values.schema.json admits no quote or
backslash in the values written so, and reaper.namespace none in the
namespace.
*/}}
{{- define "reaper.celString" -}}
{{ printf "'%s'" . }}
{{- end }}
