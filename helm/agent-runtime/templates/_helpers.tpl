{{/* Names are the release name plus the component, so two releases never collide. */}}
{{- define "agent-runtime.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agent-runtime.brain.name" -}}{{ include "agent-runtime.fullname" . }}-brain{{- end -}}
{{- define "agent-runtime.manager.name" -}}{{ include "agent-runtime.fullname" . }}-runtime-manager{{- end -}}
{{- define "agent-runtime.egressProxy.name" -}}{{ include "agent-runtime.fullname" . }}-egress-proxy{{- end -}}

{{/* host:port of the egress proxy's Service, as workers reach it (RUNTIME_MANAGER_EGRESS_PROXY). */}}
{{- define "agent-runtime.egressProxy.address" -}}
{{- printf "%s.%s.svc.%s:%v" (include "agent-runtime.egressProxy.name" .) .Release.Namespace .Values.clusterDomain .Values.egressProxy.port -}}
{{- end -}}

{{/* The egress proxy in force: enabled with at least one profile, and never beside a
     profile's direct internet egress, which would be a way around it. */}}
{{- define "agent-runtime.egressProxy.enabled" -}}
{{- if and .Values.egressProxy.enabled .Values.egressProxy.profiles -}}
{{- range .Values.egressProxy.profiles -}}
{{- if has . $.Values.networkPolicy.workers.internetEgress.profiles -}}
{{- fail (printf "profile %s is in both egressProxy.profiles and networkPolicy.workers.internetEgress.profiles: its workers would have a way around the egress proxy" .) -}}
{{- end -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/* Labels of every chart resource. Worker pods carry `managed-by: agent-runtime`
     instead (set by the manager, not by this chart). */}}
{{- define "agent-runtime.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agent-runtime
{{- end -}}

{{- define "agent-runtime.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The labels NetworkPolicies and the manager select workers by (job.rs). */}}
{{- define "agent-runtime.workerSelector" -}}
app.kubernetes.io/managed-by: agent-runtime
app.kubernetes.io/component: worker
{{- end -}}

{{- define "agent-runtime.image" -}}
{{- $image := index . 0 -}}{{- $root := index . 1 -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s" $root.Values.image.registry $image.repository $image.tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $image.tag -}}
{{- end -}}
{{- end -}}

{{- define "agent-runtime.brainUrl" -}}
{{- printf "http://%s.%s.svc.%s:%v" (include "agent-runtime.brain.name" .) .Release.Namespace .Values.clusterDomain .Values.brain.service.port -}}
{{- end -}}

{{/* A secret-backed environment variable: [name, secret, key, optional]. */}}
{{- define "agent-runtime.secretEnv" -}}
- name: {{ index . 0 }}
  valueFrom:
    secretKeyRef:
      name: {{ index . 1 }}
      key: {{ index . 2 }}
      optional: {{ index . 3 }}
{{- end -}}

{{/* DATABASE_URL (and DATABASE_DIRECT_URL behind a transaction pooler), REDIS_URL (or
     REDIS_CLUSTER_URLS) and SESSION_TOKEN_KEY, which the brain, the manager and the
     migration read alike. */}}
{{- define "agent-runtime.sharedEnv" -}}
{{- $s := .Values.secrets.existingSecret -}}
{{ include "agent-runtime.secretEnv" (list "DATABASE_URL" (default $s .Values.database.existingSecret) .Values.database.urlKey false) }}
{{- with .Values.database.directUrlKey }}
{{ include "agent-runtime.secretEnv" (list "DATABASE_DIRECT_URL" (default $s $.Values.database.existingSecret) . false) }}
{{- end }}
{{- if .Values.redis.clusterUrlsKey }}
{{ include "agent-runtime.secretEnv" (list "REDIS_CLUSTER_URLS" (default $s .Values.redis.existingSecret) .Values.redis.clusterUrlsKey false) }}
{{- else }}
{{ include "agent-runtime.secretEnv" (list "REDIS_URL" (default $s .Values.redis.existingSecret) .Values.redis.urlKey false) }}
{{- end }}
{{ include "agent-runtime.secretEnv" (list "SESSION_TOKEN_KEY" $s .Values.secrets.keys.sessionTokenKey false) }}
- name: SESSION_QUEUE_NAMESPACE
  value: {{ .Values.sessionQueueNamespace | quote }}
{{- end -}}

{{/* The brain's environment, shared by its Deployment and the migration hook so that
     `brain migrate` parses the same configuration `brain serve` will. */}}
{{- define "agent-runtime.brainEnv" -}}
{{- $s := .Values.secrets.existingSecret -}}
{{ include "agent-runtime.sharedEnv" . }}
- name: BRAIN_ADDR
  value: "0.0.0.0:{{ .Values.brain.service.port }}"
- name: BRAIN_METRICS_ADDR
  value: "0.0.0.0:{{ .Values.brain.metricsPort }}"
- name: BRAIN_DATABASE_MAX_CONNECTIONS
  value: {{ .Values.database.maxConnections | int64 | quote }}
- name: BRAIN_DRAIN_TIMEOUT_MS
  value: {{ .Values.brain.drainTimeoutMs | int64 | quote }}
- name: BRAIN_WORKER_PROVISION_TIMEOUT_MS
  value: {{ .Values.brain.workerProvisionTimeoutMs | int64 | quote }}
- name: BRAIN_DEMO_MODEL
  value: {{ .Values.brain.demoModel | quote }}
- name: BRAIN_LOG_FORMAT
  value: {{ .Values.brain.logFormat | quote }}
- name: BRAIN_LOG
  value: {{ .Values.brain.log | quote }}
{{- with (include "agent-runtime.brainPublicUrl" .) }}
- name: BRAIN_PUBLIC_URL
  value: {{ . | quote }}
{{- end }}
- name: BRAIN_ARTIFACTS_BACKEND
  value: {{ .Values.artifacts.backend | quote }}
- name: BRAIN_ARTIFACT_MAX_BYTES
  value: {{ .Values.artifacts.maxBytes | int64 | quote }}
{{- if eq .Values.artifacts.backend "s3" }}
{{- $s3 := .Values.artifacts.s3 }}
- name: BRAIN_S3_BUCKET
  value: {{ $s3.bucket | quote }}
- name: BRAIN_S3_REGION
  value: {{ $s3.region | quote }}
{{- with $s3.endpoint }}
- name: BRAIN_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: BRAIN_S3_FORCE_PATH_STYLE
  value: {{ $s3.forcePathStyle | quote }}
{{ include "agent-runtime.secretEnv" (list "AWS_ACCESS_KEY_ID" (default $s $s3.existingSecret) $s3.accessKeyIdKey false) }}
{{ include "agent-runtime.secretEnv" (list "AWS_SECRET_ACCESS_KEY" (default $s $s3.existingSecret) $s3.secretAccessKeyKey false) }}
{{- with $s3.sessionTokenKey }}
{{ include "agent-runtime.secretEnv" (list "AWS_SESSION_TOKEN" (default $s $s3.existingSecret) . false) }}
{{- end }}
{{- else }}
- name: BRAIN_ARTIFACTS_DIR
  value: /var/lib/brain/artifacts
{{- end }}
{{ include "agent-runtime.secretEnv" (list "BRAIN_SECRETS_KEY" $s .Values.secrets.keys.secretsKey true) }}
{{ include "agent-runtime.secretEnv" (list "OPENAI_API_KEY" $s .Values.secrets.keys.openaiApiKey true) }}
{{ include "agent-runtime.secretEnv" (list "ANTHROPIC_API_KEY" $s .Values.secrets.keys.anthropicApiKey true) }}
{{ include "agent-runtime.secretEnv" (list "BRAIN_OAUTH_CLIENTS" $s .Values.secrets.keys.oauthClients true) }}
{{ include "agent-runtime.secretEnv" (list "BRAIN_OPERATOR_TOKEN" $s .Values.secrets.keys.operatorToken true) }}
{{- with .Values.brain.jwt }}
{{- if .issuer }}
- name: BRAIN_JWT_ISSUER
  value: {{ .issuer | quote }}
- name: BRAIN_JWT_AUDIENCE
  value: {{ .audience | quote }}
{{- with .jwksUrl }}
- name: BRAIN_JWT_JWKS_URL
  value: {{ . | quote }}
{{- end }}
{{ include "agent-runtime.secretEnv" (list "BRAIN_JWT_HS256_SECRET" $s $.Values.secrets.keys.jwtHs256Secret true) }}
{{- end }}
{{- end }}
{{- with .Values.brain.extraEnv }}
{{ include "agent-runtime.extraEnv" . }}
{{- end }}
{{- end -}}

{{- define "agent-runtime.brainPublicUrl" -}}
{{- if .Values.brain.publicUrl -}}
{{- .Values.brain.publicUrl -}}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts -}}
{{- printf "%s://%s" (ternary "https" "http" (gt (len .Values.ingress.tls) 0)) (first .Values.ingress.hosts) -}}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security Standard, met by every pod of the chart. */}}
{{- define "agent-runtime.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "agent-runtime.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "agent-runtime.topologySpread" -}}
{{- $labels := index . 0 -}}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
{{ $labels | indent 6 }}
  matchLabelKeys: [pod-template-hash]
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
{{ $labels | indent 6 }}
  matchLabelKeys: [pod-template-hash]
{{- end -}}

{{/* Plain variables the operator adds: never one that carries a credential, which must
     come from the Secret (and is wired above). */}}
{{- define "agent-runtime.extraEnv" -}}
{{- $secretNames := list "DATABASE_URL" "DATABASE_DIRECT_URL" "REDIS_URL" "SESSION_TOKEN_KEY" "BRAIN_SECRETS_KEY" "OPENAI_API_KEY" "ANTHROPIC_API_KEY" "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "AWS_SESSION_TOKEN" "BRAIN_JWT_HS256_SECRET" "BRAIN_OAUTH_CLIENTS" -}}
{{- range . }}
{{- if has .name $secretNames }}
{{- fail (printf "%s is a credential: give it through the Secret (secrets.*), not extraEnv" .name) }}
{{- end }}
{{- end }}
{{- toYaml . }}
{{- end -}}
