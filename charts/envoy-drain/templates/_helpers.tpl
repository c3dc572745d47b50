{{/*
The policy's form: what values.form names, else the first the cluster serves (Helm asks the API
server's discovery at install and upgrade; `helm template` knows only its own defaults and
--api-versions).
*/}}
{{- define "envoy-drain.form" -}}
{{- $apis := .Capabilities.APIVersions -}}
{{- if has .Values.form (list "v1" "v1beta1" "kyverno") -}}
{{- .Values.form -}}
{{- else if ne .Values.form "auto" -}}
{{- fail (printf "form: %q: expected auto, v1, v1beta1 or kyverno" .Values.form) -}}
{{- else if and ($apis.Has "policies.kyverno.io/v1/MutatingPolicy") (lookup "policies.kyverno.io/v1" "MutatingPolicy" "" "envoy-drain-hold") -}}
{{- /* Installed as Kyverno's already: kept, though the cluster may now serve the API server's
(which costs each API server every ConfigMap in memory: docs/install.md); form=v1 moves it. */ -}}
kyverno
{{- else if $apis.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
v1
{{- else if $apis.Has "admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy" -}}
v1beta1
{{- else if $apis.Has "policies.kyverno.io/v1/MutatingPolicy" -}}
kyverno
{{- else -}}
{{- fail (printf "Kubernetes %s serves no MutatingAdmissionPolicy (admissionregistration.k8s.io/v1 from 1.36; v1beta1 on 1.34 and 1.35 with --feature-gates=MutatingAdmissionPolicy=true and --runtime-config=admissionregistration.k8s.io/v1beta1=true) and Kyverno's MutatingPolicy CRD (policies.kyverno.io/v1, Kyverno 1.17 or later) is not installed: turn one on, or install Kyverno, then install this chart again" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/*
The image the ConfigMap names: by digest where one is given, else by tag (the chart's
appVersion unless set). One the policy would take for none (its own grammar of an image
reference, read from files/hold-policy.yaml) fails here instead of serving nothing.
*/}}
{{- define "envoy-drain.image" -}}
{{- $image := "" -}}
{{- with .Values.image -}}
{{- if not .repository -}}
{{- else if .digest -}}
{{- $image = printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- $image = printf "%s:%s" .repository (.tag | default $.Chart.AppVersion | toString) -}}
{{- end -}}
{{- end -}}
{{- $grammar := regexFind "rawImage[.]matches[(]\"[^\"]+\"[)]" ($.Files.Get "files/hold-policy.yaml") -}}
{{- $grammar = $grammar | trimPrefix "rawImage.matches(\"" | trimSuffix "\")" -}}
{{- if and $image (not (regexMatch $grammar $image)) -}}
{{- fail (printf "image: %q is no image reference (REGISTRY/NAME:TAG, or @sha256: and 64 hex digits)" $image) -}}
{{- end -}}
{{- $image -}}
{{- end -}}
