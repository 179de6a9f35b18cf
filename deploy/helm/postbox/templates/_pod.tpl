{{/* The pod of postbox serve, the same in both modes but for the
volume (single) and the cluster's URLs and node name (cluster). */}}
{{- define "postbox.podTemplate" -}}
metadata:
  labels:
    {{- include "postbox.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- /* A change of the cluster's URLs restarts the pods. */}}
  {{- $annotations := deepCopy (.Values.podAnnotations | default dict) }}
  {{- if and (eq .Values.mode "cluster") (not .Values.cluster.existingSecret) }}
  {{- $_ := set $annotations "checksum/cluster" (include (print $.Template.BasePath "/secret-cluster.yaml") . | sha256sum) }}
  {{- end }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  # No POSTBOX_* variables from Services: a Service named postbox would
  # otherwise set POSTBOX_PORT and others in the pod.
  enableServiceLinks: false
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml .Values.podSecurityContext | nindent 4 }}
  containers:
    - name: postbox
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      args:
        - serve
        - --port
        - {{ .Values.service.port | quote }}
        {{- if eq .Values.mode "single" }}
        - --db
        - {{ .Values.dbPath | quote }}
        {{- end }}
        {{- if .Values.grpc.enabled }}
        - --grpc-addr
        - {{ printf ":%v" .Values.grpc.port | quote }}
        {{- end }}
        {{- range .Values.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        - name: POSTBOX_API_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ include "postbox.apiTokenSecret" . }}
              key: {{ .Values.apiToken.secretKey }}
        - name: POSTBOX_ALLOWED_HOSTS
          value: {{ include "postbox.allowedHosts" . | quote }}
        - name: LOG_FORMAT
          value: json
        {{- if eq .Values.mode "cluster" }}
        - name: POSTBOX_NODE
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: POSTBOX_STORE
          valueFrom:
            secretKeyRef:
              name: {{ include "postbox.clusterSecret" . }}
              key: {{ .Values.cluster.storeKey }}
        - name: POSTBOX_STREAMS
          valueFrom:
            secretKeyRef:
              name: {{ include "postbox.clusterSecret" . }}
              key: {{ .Values.cluster.streamsKey }}
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ .Values.service.port }}
          protocol: TCP
        {{- if .Values.grpc.enabled }}
        - name: grpc
          containerPort: {{ .Values.grpc.port }}
          protocol: TCP
        {{- end }}
      readinessProbe:
        httpGet:
          path: /ready
          port: http
          scheme: {{ .Values.scheme }}
        {{- toYaml .Values.probes.readiness | nindent 8 }}
      startupProbe:
        httpGet:
          path: /health
          port: http
          scheme: {{ .Values.scheme }}
        {{- toYaml .Values.probes.startup | nindent 8 }}
      livenessProbe:
        httpGet:
          path: /health
          port: http
          scheme: {{ .Values.scheme }}
        {{- toYaml .Values.probes.liveness | nindent 8 }}
      securityContext:
        {{- toYaml .Values.securityContext | nindent 8 }}
      resources:
        {{- toYaml .Values.resources | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if eq .Values.mode "single" }}
        - name: data
          mountPath: {{ dir .Values.dbPath }}
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
