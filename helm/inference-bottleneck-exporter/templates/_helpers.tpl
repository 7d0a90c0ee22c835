{{/*
Names and labels.
*/}}
{{- define "inference-bottleneck-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "inference-bottleneck-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "inference-bottleneck-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "inference-bottleneck-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inference-bottleneck-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "inference-bottleneck-exporter.labels" -}}
helm.sh/chart: {{ include "inference-bottleneck-exporter.chart" . }}
{{ include "inference-bottleneck-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: inference-bottleneck-exporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The rule profile: prometheusRule.profile, else the mode's (node, dcgm, sidecar).
*/}}
{{- define "inference-bottleneck-exporter.ruleProfile" -}}
{{- if .Values.prometheusRule.profile }}
{{- .Values.prometheusRule.profile }}
{{- else if eq .Values.mode "dcgm" }}
{{- "dcgm" }}
{{- else if eq .Values.mode "node" }}
{{- "node" }}
{{- else }}
{{- "sidecar" }}
{{- end }}
{{- end }}

{{/*
The pods the PodMonitor selects: those that carry sidecar.podLabels (in node mode the node
agent's pods have a PodMonitor of their own).
*/}}
{{- define "inference-bottleneck-exporter.targetSelector" -}}
matchLabels:
  {{- toYaml .Values.sidecar.podLabels | nindent 2 }}
{{- end }}

{{/*
The pods the Service (for the ServiceMonitor) selects: the node agent's in node mode, else
those that carry sidecar.podLabels.
*/}}
{{- define "inference-bottleneck-exporter.serviceSelector" -}}
{{- if eq .Values.mode "node" }}
matchLabels:
  {{- include "inference-bottleneck-exporter.selectorLabels" . | nindent 2 }}
{{- else }}
{{- include "inference-bottleneck-exporter.targetSelector" . }}
{{- end }}
{{- end }}

{{- define "inference-bottleneck-exporter.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
A config map (sidecar.config, node.config) as flags; `where` names it in errors.
*/}}
{{- define "inference-bottleneck-exporter.configFlags" -}}
{{- $where := .where }}
{{- range $flag, $value := .config }}
{{- if kindIs "bool" $value }}
- --{{ ternary "" "no-" $value }}{{ $flag }}
{{- else if or (kindIs "invalid" $value) (kindIs "map" $value) (kindIs "slice" $value) }}
{{- fail (printf "%s.%s: give a flag's value, true or false (flags are dotted: engine.url)" $where $flag) }}
{{- else }}
- {{ printf "--%s=%v" $flag $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The sidecar's arguments: its port, sidecar.config as flags, the mode's collector flags (last,
so they win), then sidecar.extraArgs. In dcgm and node modes the sidecar runs everything but
nvml (the GPUs are dcgm-exporter's or the node agent's).
*/}}
{{- define "inference-bottleneck-exporter.args" -}}
- --web.listen-address=:{{ .Values.sidecar.port }}
{{- include "inference-bottleneck-exporter.configFlags" (dict "config" .Values.sidecar.config "where" "sidecar.config") }}
{{- if ne .Values.mode "sidecar" }}
- --no-collector.nvml
- {{ printf "--gpu.read-by=%s on $(NODE_NAME)" (ternary "the node agent" "dcgm-exporter or the node agent" (eq .Values.mode "node")) | quote }}
{{- end }}
{{- if include "inference-bottleneck-exporter.hostProcfs" . }}
- --gpu.host-procfs=/host/proc
{{- end }}
{{- range .Values.sidecar.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Non-empty when the sidecar gets the host's /proc (gpu.hostProcfs, sidecar mode).
*/}}
{{- define "inference-bottleneck-exporter.hostProcfs" -}}
{{- if and .Values.gpu.hostProcfs (eq .Values.mode "sidecar") }}true{{ end }}
{{- end }}

{{/*
The pod volumes the exporter container mounts (gpu.hostProcfs: the host's /proc), as list
items for the pod's `volumes:`; empty when there are none.
*/}}
{{- define "inference-bottleneck-exporter.sidecarVolumes" -}}
{{- if include "inference-bottleneck-exporter.hostProcfs" . }}
- name: host-proc
  hostPath:
    path: /proc
    type: Directory
{{- end }}
{{- end }}

{{/*
The exporter container, for the example Deployment, the node DaemonSet, and your own inference
Deployment. Its context is this chart's: `.` here, and from a chart that has this one as a
dependency `(index .Subcharts "inference-bottleneck-exporter")`. It renders one list item:

  containers:            # or initContainers: with sidecar.native=true
    - name: vllm
      ...
    {{- include "inference-bottleneck-exporter.sidecar" (index .Subcharts "inference-bottleneck-exporter") | nindent 4 }}
*/}}
{{- define "inference-bottleneck-exporter.sidecar" -}}
{{- $native := .Values.sidecar.native }}
{{- if and $native (not (semverCompare ">=1.29-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "sidecar.native needs Kubernetes >= 1.29 (native sidecars), this is %s" .Capabilities.KubeVersion.Version) }}
{{- end -}}
- name: {{ .Values.sidecar.containerName }}
  image: {{ include "inference-bottleneck-exporter.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if $native }}
  restartPolicy: Always
  {{- end }}
  args:
    {{- include "inference-bottleneck-exporter.args" . | nindent 4 }}
  {{- $gpuEnv := and (eq .Values.mode "sidecar") .Values.gpu.visibleDevices }}
  {{- /* Without NVML the landing page names who reads the GPUs: that on the pod's node. */}}
  {{- $nodeEnv := ne .Values.mode "sidecar" }}
  {{- if or $gpuEnv $nodeEnv .Values.sidecar.extraEnv }}
  env:
    {{- if $gpuEnv }}
    - name: NVIDIA_VISIBLE_DEVICES
      value: {{ .Values.gpu.visibleDevices | quote }}
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: {{ .Values.gpu.driverCapabilities | quote }}
    {{- end }}
    {{- if $nodeEnv }}
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    {{- end }}
    {{- with .Values.sidecar.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: {{ .Values.sidecar.portName }}
      containerPort: {{ .Values.sidecar.port }}
      protocol: TCP
  livenessProbe:
    {{- toYaml .Values.sidecar.livenessProbe | nindent 4 }}
  readinessProbe:
    {{- toYaml .Values.sidecar.readinessProbe | nindent 4 }}
  {{- $resources := deepCopy (.Values.sidecar.resources | default dict) }}
  {{- if and (eq .Values.mode "sidecar") .Values.gpu.resourceClaims }}
  {{- $claims := list }}
  {{- range .Values.gpu.resourceClaims }}
  {{- $claims = append $claims (dict "name" .) }}
  {{- end }}
  {{- $_ := set $resources "claims" $claims }}
  {{- end }}
  {{- with $resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.sidecar.securityContext | nindent 4 }}
  {{- $mounts := .Values.sidecar.extraVolumeMounts | default list }}
  {{- if include "inference-bottleneck-exporter.hostProcfs" . }}
  {{- $mounts = append $mounts (dict "name" "host-proc" "mountPath" "/host/proc" "readOnly" true) }}
  {{- end }}
  {{- with $mounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
The pod labels that let the PodMonitor find a pod with the sidecar (sidecar and dcgm modes), for
your inference pods' metadata.labels.
*/}}
{{- define "inference-bottleneck-exporter.sidecarPodLabels" -}}
{{- toYaml .Values.sidecar.podLabels }}
{{- end }}

{{/*
Pod Security "restricted" at the pod level.
*/}}
{{- define "inference-bottleneck-exporter.podSecurityContext" -}}
runAsNonRoot: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The node agent's container (node mode's DaemonSet): NVML for every GPU of the node, the host's
CPU times, and the kubelet's PodResources socket to tell which pod holds each GPU.
*/}}
{{- define "inference-bottleneck-exporter.nodeAgent" -}}
- name: {{ .Values.sidecar.containerName }}
  image: {{ include "inference-bottleneck-exporter.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - --web.listen-address=:{{ .Values.sidecar.port }}
    {{- include "inference-bottleneck-exporter.configFlags" (dict "config" .Values.node.config "where" "node.config") | nindent 4 }}
    - --collector.nvml
    - --collector.cpu
    - --collector.podresources
    - --no-collector.engine
    - --no-collector.tokenizer
    - --no-collector.process
    - --no-collector.model
    - --podresources.socket=/var/lib/kubelet/pod-resources/kubelet.sock
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: {{ .Values.gpu.driverCapabilities | quote }}
  ports:
    - name: {{ .Values.sidecar.portName }}
      containerPort: {{ .Values.sidecar.port }}
      protocol: TCP
  livenessProbe:
    {{- toYaml .Values.sidecar.livenessProbe | nindent 4 }}
  readinessProbe:
    {{- toYaml .Values.sidecar.readinessProbe | nindent 4 }}
  {{- with .Values.sidecar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml .Values.node.securityContext | nindent 4 }}
  volumeMounts:
    - name: pod-resources
      mountPath: /var/lib/kubelet/pod-resources
      readOnly: true
{{- end }}
