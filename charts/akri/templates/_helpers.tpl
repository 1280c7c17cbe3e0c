{{/*
The prefix of every object's name: <release>-akri, or the release name when it already
contains the chart name. Cluster-scoped objects carry it too, so two releases never collide.
*/}}
{{- define "akri.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 35 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 35 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 35 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name: <fullname>-<component>. Call with (list $ "kubelet-plugin"). */}}
{{- define "akri.componentName" -}}
{{- printf "%s-%s" (include "akri.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{- define "akri.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "akri.labels" -}}
helm.sh/chart: {{ include "akri.chart" . }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: akri
{{- end -}}

{{/* Selector labels of a component. Call with (list $ "kubelet-plugin"). */}}
{{- define "akri.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ default $root.Chart.Name $root.Values.nameOverride | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of a component's objects. Call with (list $ "kubelet-plugin"). */}}
{{- define "akri.componentLabels" -}}
{{ include "akri.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* A component's image reference. Call with (list $ .Values.kubeletPlugin.image). */}}
{{- define "akri.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- /* image.registry replaces a component's registry; a component whose registry is empty
names its whole image in repository, which stays as it is. */ -}}
{{- $registry := $image.registry -}}
{{- if and $image.registry $root.Values.image.registry -}}
{{- $registry = $root.Values.image.registry -}}
{{- end -}}
{{- $name := printf "%s/%s" (trimSuffix "/" $registry) $image.repository -}}
{{- if not $registry -}}
{{- $name = $image.repository -}}
{{- end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default $root.Chart.AppVersion (default $image.tag $root.Values.image.tag)) -}}
{{- end -}}
{{- end -}}

{{/* imagePullPolicy of a component's image: image.pullPolicy, else the component's own. Call
with (list $ .Values.kubeletPlugin.image). */}}
{{- define "akri.pullPolicy" -}}
{{- default (index . 1).pullPolicy (index . 0).Values.image.pullPolicy -}}
{{- end -}}

{{/* RUST_LOG of a component. Call with (list $ .Values.kubeletPlugin). */}}
{{- define "akri.logLevel" -}}
{{- default (index . 0).Values.logLevel (index . 1).logLevel -}}
{{- end -}}

{{/* --metrics-address of every component. */}}
{{- define "akri.metricsAddress" -}}
{{- printf "%s:%d" .Values.metrics.bindAddress (int .Values.metrics.port) -}}
{{- end -}}

{{/* The ServiceAccount user name of a component. Call with (list $ "kubelet-plugin"). */}}
{{- define "akri.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" (index . 0).Release.Namespace (include "akri.componentName" .) -}}
{{- end -}}

{{/*
"true" where DRA is served (the `dra` value; `auto`: where the API server serves
resource.k8s.io/v1, 1.34 and later), "" elsewhere (1.33 and older, where only the legacy
device plugins run). `helm template` answers `auto` from Helm's own list of APIs.
*/}}
{{- define "akri.servesDra" -}}
{{- if eq .Values.dra "on" }}true
{{- else if and (eq .Values.dra "auto") (.Capabilities.APIVersions.Has "resource.k8s.io/v1") }}true
{{- end -}}
{{- end -}}

{{/* The namespaces whose v0 Configurations are served, comma separated (the release's when
none are listed). */}}
{{- define "akri.legacyNamespaces" -}}
{{- .Values.legacyDevicePlugin.namespaces | default (list .Release.Namespace) | join "," -}}
{{- end -}}

{{/* The driver-controller's Lease name. */}}
{{- define "akri.leaseName" -}}
{{- default (include "akri.componentName" (list . "driver-controller")) .Values.driverController.leaseName -}}
{{- end -}}

{{/* Liveness and readiness probes on the metrics port (shared by the components). */}}
{{- define "akri.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end -}}

{{/* The namespaces whose Secrets and ConfigMaps discovery properties may read, comma-separated:
the propertyNamespaces, or the release namespace when none are listed. */}}
{{- define "akri.propertyNamespaces" -}}
{{- .Values.propertyNamespaces | default (list .Release.Namespace) | join "," -}}
{{- end -}}
