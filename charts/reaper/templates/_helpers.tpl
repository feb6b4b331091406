{{/*
The labels every object carries. No Helm labels: the same objects are
applied with kubectl from deploy/*.yaml, and Helm adds its own ownership
metadata when it installs them.
*/}}
{{- define "reaper.labels" -}}
app.kubernetes.io/name: reaper
{{- end }}

{{/*
A CEL string literal of a value: values.schema.json admits no quote or
backslash in the values written so.
*/}}
{{- define "reaper.celString" -}}
{{ printf "'%s'" . }}
{{- end }}
