// Package test renders the Helm chart deploy/helm/postbox with the values
// users set and decodes every manifest strictly into its Kubernetes type
// (k8s.io/api): an unknown field or a wrong type fails, as the API server
// would refuse it. It is a module of its own so that postbox's go.mod
// does not carry Kubernetes; .ci/run runs it.
package test

import (
	"bytes"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chart     = "../postbox"
	release   = "rel"
	namespace = "events"
	fullname  = "rel-postbox"
)

// helm returns the helm binary, skipping the test without one, or
// failing it under POSTBOX_REQUIRE_SERVICES=1 (CI).
func helm(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("helm")
	if err == nil {
		return bin
	}
	msg := "helm not on PATH (go install helm.sh/helm/v3/cmd/helm@v3.22.0): the chart is not rendered"
	if os.Getenv("POSTBOX_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg + ", and POSTBOX_REQUIRE_SERVICES=1")
	}
	t.Skip(msg)
	return ""
}

// render runs helm template with values (YAML, on its standard input)
// and returns its output
// and error.
func render(t *testing.T, values string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm(t), "template", release, chart, "--namespace", namespace, "--values", "-")
	cmd.Stdin = strings.NewReader(values)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", &renderError{err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

type renderError struct {
	err    error
	stderr string
}

func (e *renderError) Error() string { return e.err.Error() + ": " + e.stderr }

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor
// the chart writes; decoding strictly into it refuses any other field.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Scheme        string `json:"scheme"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
			Authorization struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// manifests is one rendering, decoded.
type manifests struct {
	statefulSets []appsv1.StatefulSet
	deployments  []appsv1.Deployment
	services     []corev1.Service
	secrets      []corev1.Secret
	configMaps   []corev1.ConfigMap
	monitors     []serviceMonitor
}

// decode splits out into documents and decodes each strictly into the
// type of its apiVersion and kind.
func decode(t *testing.T, out string) manifests {
	t.Helper()
	var m manifests
	for doc := range strings.SplitSeq(out, "\n---") {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("a manifest is not YAML: %v\n%s", err, doc)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 StatefulSet":
			m.statefulSets = append(m.statefulSets, appsv1.StatefulSet{})
			obj = &m.statefulSets[len(m.statefulSets)-1]
		case "apps/v1 Deployment":
			m.deployments = append(m.deployments, appsv1.Deployment{})
			obj = &m.deployments[len(m.deployments)-1]
		case "v1 Service":
			m.services = append(m.services, corev1.Service{})
			obj = &m.services[len(m.services)-1]
		case "v1 Secret":
			m.secrets = append(m.secrets, corev1.Secret{})
			obj = &m.secrets[len(m.secrets)-1]
		case "v1 ConfigMap":
			m.configMaps = append(m.configMaps, corev1.ConfigMap{})
			obj = &m.configMaps[len(m.configMaps)-1]
		case "monitoring.coreos.com/v1 ServiceMonitor":
			m.monitors = append(m.monitors, serviceMonitor{})
			obj = &m.monitors[len(m.monitors)-1]
		default:
			t.Fatalf("a manifest of %s %s, which the test does not know:\n%s", tm.APIVersion, tm.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s: %v\n%s", tm.Kind, err, doc)
		}
	}
	return m
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// pod returns the rendered workload's pod template and its selector, and
// checks there is exactly one workload, of the mode's kind.
func (m manifests) pod(t *testing.T, mode string) (corev1.PodTemplateSpec, *metav1.LabelSelector) {
	t.Helper()
	switch {
	case mode == "single" && len(m.statefulSets) == 1 && len(m.deployments) == 0:
		return m.statefulSets[0].Spec.Template, m.statefulSets[0].Spec.Selector
	case mode == "cluster" && len(m.deployments) == 1 && len(m.statefulSets) == 0:
		return m.deployments[0].Spec.Template, m.deployments[0].Spec.Selector
	}
	t.Fatalf("%s mode: %d StatefulSets and %d Deployments", mode, len(m.statefulSets), len(m.deployments))
	return corev1.PodTemplateSpec{}, nil
}

// secret returns the rendered Secret name, or nil.
func (m manifests) secret(name string) *corev1.Secret {
	for i := range m.secrets {
		if m.secrets[i].Name == name {
			return &m.secrets[i]
		}
	}
	return nil
}

// env returns the container's variable name.
func env(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// matches reports whether every label of want is in have.
func matches(want, have map[string]string) bool {
	if len(want) == 0 {
		return false
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// checkSecretRef checks that v comes from key of the Secret name, which
// the chart rendered with that key unless it is the user's (existing).
func checkSecretRef(t *testing.T, m manifests, v *corev1.EnvVar, name, key string, existing bool) {
	t.Helper()
	if v == nil || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("want a variable from Secret %s key %s, got %+v", name, key, v)
	}
	ref := v.ValueFrom.SecretKeyRef
	if ref.Name != name || ref.Key != key {
		t.Errorf("%s from Secret %s key %s, want %s key %s", v.Name, ref.Name, ref.Key, name, key)
	}
	s := m.secret(name)
	if existing {
		if s != nil {
			t.Errorf("Secret %s is the user's, but the chart renders one", name)
		}
		return
	}
	if s == nil {
		t.Fatalf("%s from Secret %s, which is not rendered", v.Name, name)
	}
	if len(s.Data[key]) == 0 && s.StringData[key] == "" {
		t.Errorf("Secret %s has no %s", name, key)
	}
}

// checkCommon checks what both modes must have: the Service selects the
// pods, probes on /ready and /health at a declared port, the API token
// from its Secret, the allowed hosts, non-root and a read-only root.
func checkCommon(t *testing.T, m manifests, mode, tokenSecret string, existing bool) (corev1.PodTemplateSpec, corev1.Container) {
	t.Helper()
	pod, sel := m.pod(t, mode)
	if sel == nil || !matches(sel.MatchLabels, pod.Labels) {
		t.Errorf("the workload's selector %v does not select its pods %v", sel, pod.Labels)
	}
	if len(m.services) != 1 {
		t.Fatalf("%d Services, want 1", len(m.services))
	}
	svc := m.services[0]
	if svc.Name != fullname || !matches(svc.Spec.Selector, pod.Labels) {
		t.Errorf("Service %s selects %v, the pods are %v", svc.Name, svc.Spec.Selector, pod.Labels)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Errorf("args %q, want serve first", c.Args)
	}
	var ports []string
	for _, p := range c.Ports {
		ports = append(ports, p.Name)
	}
	for _, p := range svc.Spec.Ports {
		if !slices.Contains(ports, p.TargetPort.String()) {
			t.Errorf("Service port %s targets %s, not a port of the container (%v)", p.Name, p.TargetPort.String(), ports)
		}
	}
	for _, probe := range []struct {
		name, path string
		p          *corev1.Probe
	}{{"readiness", "/ready", c.ReadinessProbe}, {"startup", "/health", c.StartupProbe}, {"liveness", "/health", c.LivenessProbe}} {
		if probe.p == nil || probe.p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", probe.name)
			continue
		}
		if probe.p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s probe over %s, want HTTP", probe.name, probe.p.HTTPGet.Scheme)
		}
		if probe.p.HTTPGet.Path != probe.path || !slices.Contains(ports, probe.p.HTTPGet.Port.String()) {
			t.Errorf("%s probe GET %s on port %s, want %s on one of %v", probe.name, probe.p.HTTPGet.Path, probe.p.HTTPGet.Port.String(), probe.path, ports)
		}
	}
	checkSecretRef(t, m, env(c, "POSTBOX_API_TOKEN"), tokenSecret, "api-token", existing)
	hosts := env(c, "POSTBOX_ALLOWED_HOSTS")
	if hosts == nil || !slices.Contains(strings.Split(hosts.Value, ","), fullname+"."+namespace+".svc.cluster.local") {
		t.Errorf("POSTBOX_ALLOWED_HOSTS %+v lacks the Service's name", hosts)
	}
	psc, sc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("the pod must run as non-root on a read-only root: %+v %+v", psc, sc)
	}
	if pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks {
		t.Error("enableServiceLinks is not false: a Service named postbox would set POSTBOX_* variables")
	}
	if c.Resources.Limits.Memory().IsZero() {
		t.Error("no memory limit")
	}
	return pod, c
}

// checkSingle checks the single node: one replica, the database's
// directory on the claim, no cluster URLs.
func checkSingle(t *testing.T, m manifests, db string) {
	t.Helper()
	ss := m.statefulSets[0]
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 {
		t.Errorf("StatefulSet replicas %v, want 1 (one writer of the SQLite file)", ss.Spec.Replicas)
	}
	if ss.Spec.ServiceName != m.services[0].Name {
		t.Errorf("StatefulSet serviceName %q, the Service is %q", ss.Spec.ServiceName, m.services[0].Name)
	}
	c := ss.Spec.Template.Spec.Containers[0]
	i := slices.Index(c.Args, "--db")
	if i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != db {
		t.Fatalf("args %q, want --db %s", c.Args, db)
	}
	if len(ss.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("%d volumeClaimTemplates, want 1", len(ss.Spec.VolumeClaimTemplates))
	}
	claim := ss.Spec.VolumeClaimTemplates[0]
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.Name == claim.Name && vm.MountPath == path.Dir(db) && !vm.ReadOnly {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("claim %s is not mounted at %s: %+v", claim.Name, path.Dir(db), c.VolumeMounts)
	}
	if claim.Spec.Resources.Requests.Storage().IsZero() {
		t.Error("the claim requests no storage")
	}
	for _, name := range []string{"POSTBOX_STORE", "POSTBOX_STREAMS", "POSTBOX_NODE"} {
		if env(c, name) != nil {
			t.Errorf("single mode sets %s", name)
		}
	}
}

// checkCluster checks cluster mode: the replicas, the URLs from the
// Secret, the node's name from the pod's, no SQLite file.
func checkCluster(t *testing.T, m manifests, replicas int32, secret string, existing bool) {
	t.Helper()
	d := m.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != replicas {
		t.Errorf("Deployment replicas %v, want %d", d.Spec.Replicas, replicas)
	}
	c := d.Spec.Template.Spec.Containers[0]
	checkSecretRef(t, m, env(c, "POSTBOX_STORE"), secret, "store", existing)
	checkSecretRef(t, m, env(c, "POSTBOX_STREAMS"), secret, "streams", existing)
	node := env(c, "POSTBOX_NODE")
	if node == nil || node.ValueFrom == nil || node.ValueFrom.FieldRef == nil || node.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POSTBOX_NODE %+v, want the pod's name (fieldRef metadata.name)", node)
	}
	if slices.Contains(c.Args, "--db") {
		t.Errorf("cluster mode passes --db: %q", c.Args)
	}
	if len(m.statefulSets) != 0 {
		t.Error("cluster mode renders a StatefulSet")
	}
}

func TestChartRenders(t *testing.T) {
	helm(t)
	dashboard, err := os.ReadFile("../../grafana/postbox.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		values string
		check  func(t *testing.T, m manifests)
	}{{
		name:   "defaults",
		values: ``,
		check: func(t *testing.T, m manifests) {
			checkCommon(t, m, "single", fullname+"-api-token", false)
			checkSingle(t, m, "/data/postbox.db")
			if n := len(m.secret(fullname + "-api-token").Data["api-token"]); n != 40 {
				t.Errorf("a random token of %d characters, want 40", n)
			}
			if len(m.monitors)+len(m.configMaps) != 0 {
				t.Error("a ServiceMonitor or the dashboard without being asked")
			}
		},
	}, {
		name: "single with an existing secret and gRPC and another db",
		values: `
apiToken: {existingSecret: my-token}
dbPath: /var/lib/postbox/events.db
grpc: {enabled: true}
allowedHosts: [postbox.example.com]
extraArgs: [--auth-tokens, /etc/postbox/tokens]
extraVolumes: [{name: tokens, secret: {secretName: device-tokens}}]
extraVolumeMounts: [{name: tokens, mountPath: /etc/postbox, readOnly: true}]
persistence: {size: 20Gi, storageClass: fast}
`,
		check: func(t *testing.T, m manifests) {
			_, c := checkCommon(t, m, "single", "my-token", true)
			checkSingle(t, m, "/var/lib/postbox/events.db")
			if i := slices.Index(c.Args, "--grpc-addr"); i < 0 || c.Args[i+1] != ":9000" {
				t.Errorf("args %q, want --grpc-addr :9000", c.Args)
			}
			if !slices.Contains(c.Args, "--auth-tokens") || len(c.VolumeMounts) != 3 || c.VolumeMounts[2].MountPath != "/etc/postbox" {
				t.Errorf("extraArgs %q or extraVolumeMounts %+v not set", c.Args, c.VolumeMounts)
			}
			if v := m.statefulSets[0].Spec.Template.Spec.Volumes; len(v) != 2 || v[1].Secret == nil || v[1].Secret.SecretName != "device-tokens" {
				t.Errorf("extraVolumes not set: %+v", v)
			}
			if !strings.HasSuffix(env(c, "POSTBOX_ALLOWED_HOSTS").Value, ",postbox.example.com") {
				t.Errorf("POSTBOX_ALLOWED_HOSTS %q lacks allowedHosts", env(c, "POSTBOX_ALLOWED_HOSTS").Value)
			}
			if sc := m.statefulSets[0].Spec.VolumeClaimTemplates[0].Spec.StorageClassName; sc == nil || *sc != "fast" {
				t.Errorf("storage class %v, want fast", sc)
			}
		},
	}, {
		name: "cluster on PostgreSQL and NATS",
		values: `
mode: cluster
replicas: 3
apiToken: {value: s3cret}
cluster:
  store: postgres://postbox:pw@db:5432/postbox?schema=postbox
  streams: nats://nats-1:4222,nats-2:4222,nats-3:4222?replicas=3
`,
		check: func(t *testing.T, m manifests) {
			checkCommon(t, m, "cluster", fullname+"-api-token", false)
			checkCluster(t, m, 3, fullname+"-cluster", false)
			if got := string(m.secret(fullname + "-api-token").Data["api-token"]); got != "s3cret" {
				t.Errorf("token %q, want apiToken.value", got)
			}
			if got := m.secret(fullname + "-cluster").StringData["streams"]; got != "nats://nats-1:4222,nats-2:4222,nats-3:4222?replicas=3" {
				t.Errorf("streams %q", got)
			}
		},
	}, {
		name: "cluster on Kafka from an existing secret",
		values: `
mode: cluster
replicas: 2
apiToken: {existingSecret: tok}
cluster: {existingSecret: urls}
`,
		check: func(t *testing.T, m manifests) {
			checkCommon(t, m, "cluster", "tok", true)
			checkCluster(t, m, 2, "urls", true)
		},
	}, {
		name: "cluster on Kafka",
		values: `
mode: cluster
cluster:
  store: postgres://postbox@db:5432/postbox
  streams: kafka://kafka-1:9092,kafka-2:9092?replication_factor=3
`,
		check: func(t *testing.T, m manifests) {
			checkCommon(t, m, "cluster", fullname+"-api-token", false)
			checkCluster(t, m, 2, fullname+"-cluster", false)
		},
	}, {
		name: "ServiceMonitor and dashboard",
		values: `
serviceMonitor: {enabled: true, labels: {release: prom}}
grafanaDashboard: {enabled: true, namespace: monitoring}
`,
		check: func(t *testing.T, m manifests) {
			checkCommon(t, m, "single", fullname+"-api-token", false)
			if len(m.monitors) != 1 {
				t.Fatalf("%d ServiceMonitors, want 1", len(m.monitors))
			}
			sm := m.monitors[0]
			if sm.Labels["release"] != "prom" || !matches(sm.Spec.Selector.MatchLabels, m.services[0].Labels) {
				t.Errorf("ServiceMonitor labels %v selects %v, the Service is %v", sm.Labels, sm.Spec.Selector.MatchLabels, m.services[0].Labels)
			}
			if len(sm.Spec.Endpoints) != 1 {
				t.Fatalf("%d endpoints", len(sm.Spec.Endpoints))
			}
			ep := sm.Spec.Endpoints[0]
			cred := ep.Authorization.Credentials
			if ep.Port != "http" || ep.Path != "/metrics" || ep.Scheme != "http" || ep.Authorization.Type != "Bearer" || cred.Name != fullname+"-api-token" || cred.Key != "api-token" {
				t.Errorf("endpoint %+v, want /metrics on http with the API token", ep)
			}
			if len(m.configMaps) != 1 {
				t.Fatalf("%d ConfigMaps, want 1", len(m.configMaps))
			}
			cm := m.configMaps[0]
			if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "monitoring" {
				t.Errorf("dashboard ConfigMap labels %v in %q", cm.Labels, cm.Namespace)
			}
			if strings.TrimSpace(cm.Data["postbox.json"]) != strings.TrimSpace(string(dashboard)) {
				t.Error("the dashboard ConfigMap does not hold deploy/grafana/postbox.json")
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := render(t, tt.values)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, decode(t, out))
		})
	}
}

func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name, values, want string
	}{
		{"unknown mode", "mode: ha", `mode "ha"`},
		{"cluster without a store", "mode: cluster\ncluster: {streams: nats://n:4222}", "set cluster.store"},
		{"cluster on sqlite streams", "mode: cluster\ncluster: {store: postgres://db/p, streams: sqlite}", `cluster.streams "sqlite"`},
		{"unknown scheme", "scheme: https", `scheme "https"`},
		{"cluster of no nodes", "mode: cluster\nreplicas: 0\ncluster: {existingSecret: u}", "replicas 0"},
	}
	helm(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := render(t, tt.values)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestChartLint(t *testing.T) {
	bin := helm(t)
	for _, set := range [][]string{nil, {"--set", "mode=cluster,cluster.existingSecret=urls"}} {
		out, err := exec.Command(bin, append([]string{"lint", "--strict", chart}, set...)...).CombinedOutput()
		if err != nil {
			t.Errorf("helm lint --strict %q: %v\n%s", set, err, out)
		}
	}
}

// TestDashboardCopy keeps the chart's copy of the Grafana dashboard (a
// chart cannot hold a symlink out of its directory) equal to the original.
func TestDashboardCopy(t *testing.T) {
	orig, err := os.ReadFile("../../grafana/postbox.json")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := os.ReadFile("../postbox/dashboards/postbox.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, cp) {
		t.Error("deploy/helm/postbox/dashboards/postbox.json differs from deploy/grafana/postbox.json: cp deploy/grafana/postbox.json deploy/helm/postbox/dashboards/")
	}
}
