package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/delayq/delayq/internal/sidecar"
)

// The parts of the Kubernetes objects the test checks.
type k8sMeta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port's name
	} `yaml:"httpGet"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
}

type k8sObject struct {
	file string    // relative to manifestDir
	node yaml.Node // the whole document, for the kinds checked apart

	APIVersion string  `yaml:"apiVersion"`
	Kind       string  `yaml:"kind"`
	Metadata   k8sMeta `yaml:"metadata"`
	Spec       struct {
		Replicas *int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata k8sMeta `yaml:"metadata"`
			Spec     struct {
				TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
				Containers                    []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		Groups any `yaml:"groups"` // PrometheusRule
	} `yaml:"spec"`
	Data map[string]string `yaml:"data"` // ConfigMap
}

const manifestDir = "../../deploy/kubernetes"

// readManifests parses every YAML document under deploy/kubernetes and its
// subdirectories (autoscaling/).
func readManifests(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", manifestDir, err)
	}
	sub, err := filepath.Glob(filepath.Join(manifestDir, "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, sub...)
	var objs []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for i := 0; ; i++ {
			var node yaml.Node
			if err := dec.Decode(&node); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			var o k8sObject
			if err := node.Decode(&o); err != nil {
				t.Fatalf("%s: document %d: %v", f, i, err)
			}
			o.file, _ = filepath.Rel(manifestDir, f)
			o.node = node
			if o.APIVersion == "" || o.Kind == "" {
				t.Errorf("%s: document %d has no apiVersion or kind", f, i)
			}
			if o.Kind != "Kustomization" && o.Metadata.Name == "" {
				t.Errorf("%s: %s without metadata.name", f, o.Kind)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

// commandHelp is `delayq <sub> --help` of this binary.
func commandHelp(t *testing.T, sub string) string {
	t.Helper()
	r := cliRun(t, nil, sub, "--help")
	if r.code != exitOK {
		t.Fatalf("delayq %s --help: exit %d\n%s%s", sub, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// hasFlag reports whether a command's help lists --name.
func hasFlag(help, name string) bool {
	return regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + `( |$)`).MatchString(help)
}

// flagDefault is the default a command's help shows for --name ("" if none).
func flagDefault(t *testing.T, help, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(name) + `(?: \S+)?\n\s+.*\(default "?([^")]*)"?\)$`).FindStringSubmatch(help)
	if m == nil {
		t.Fatalf("the help shows no default of --%s:\n%s", name, help)
	}
	return m[1]
}

// flagValue is the value of --name in args (--name v or --name=v), or def.
func flagValue(args []string, name, def string) string {
	for i, a := range args {
		for _, p := range []string{"-" + name, "--" + name} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
	}
	return def
}

// delayqArgs returns the delayq command line a container runs (without the
// program name), or nil if it does not run delayq. The image built from the
// Dockerfile has /delayq as its entry point.
func delayqArgs(c k8sContainer) []string {
	if len(c.Command) == 0 {
		if c.Image == "delayq" || strings.HasSuffix(strings.Split(c.Image, ":")[0], "/delayq") {
			return c.Args
		}
		return nil
	}
	if filepath.Base(c.Command[0]) != "delayq" {
		return nil
	}
	return append(slices.Clone(c.Command[1:]), c.Args...)
}

// servedPaths starts the admin server the relay and the worker run (with no
// checks) and returns the status each path answers.
func servedPaths(t *testing.T, paths ...string) map[string]int {
	t.Helper()
	srv, err := sidecar.Start(sidecar.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	out := map[string]int{}
	for _, p := range paths {
		resp, err := client.Get("http://" + srv.Addr() + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		out[p] = resp.StatusCode
	}
	return out
}

// TestKubernetesManifests parses every manifest and checks them against the
// binary: each delayq flag they pass exists; the relay and worker listen on every
// interface on the port of their --listen default, which is the container port,
// the probes' port and the scrape annotation's; liveness and startup probe
// /healthz and readiness /readyz, paths the admin server answers 200 on (as it
// does /metrics); the relay runs more than one replica under a
// PodDisruptionBudget; every container has resources; a worker's grace period
// outlasts its --shutdown-timeout; the kustomization lists files that exist;
// KEDA's ScaledObjects read the relay's /forecast (checkScaledObjects).
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	objs := readManifests(t)
	served := servedPaths(t, "/healthz", "/readyz", "/metrics")
	for p, code := range served {
		if code != http.StatusOK {
			t.Errorf("the admin server answers %s with %d", p, code)
		}
	}

	var relays int
	pdbs := map[string]k8sObject{}
	for _, o := range objs {
		if o.Kind == "PodDisruptionBudget" {
			pdbs[o.Metadata.Name] = o
		}
	}
	for _, o := range objs {
		if o.Kind != "Deployment" && o.Kind != "Job" {
			continue
		}
		where := o.file + ": " + o.Kind + " " + o.Metadata.Name
		pod := o.Spec.Template
		if len(pod.Spec.Containers) == 0 {
			t.Errorf("%s: no containers", where)
		}
		for _, c := range pod.Spec.Containers {
			where := where + ", container " + c.Name
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s: want resources.requests cpu and memory and limits.memory, got %+v", where, c.Resources)
			}
			args := delayqArgs(c)
			if len(args) == 0 {
				t.Errorf("%s: runs no delayq command (command %q, args %q)", where, c.Command, c.Args)
				continue
			}
			sub := args[0]
			if _, ok := commands()[sub]; !ok {
				t.Errorf("%s: delayq has no command %q", where, sub)
				continue
			}
			help := commandHelp(t, sub)
			for _, a := range args[1:] {
				if name, ok := strings.CutPrefix(a, "-"); ok {
					name = strings.TrimPrefix(name, "-")
					name, _, _ = strings.Cut(name, "=")
					if !hasFlag(help, name) {
						t.Errorf("%s: delayq %s has no flag --%s", where, sub, name)
					}
				}
			}
			if sub != "relay" && sub != "worker" {
				continue
			}
			if o.Kind != "Deployment" {
				t.Errorf("%s: a long-running delayq %s belongs in a Deployment", where, sub)
			}
			// The port comes from the binary's --listen default; the pod must
			// listen on every interface, or nothing outside the pod reaches it.
			_, defPort, err := net.SplitHostPort(flagDefault(t, help, "listen"))
			if err != nil {
				t.Fatalf("delayq %s --listen default: %v", sub, err)
			}
			listen := flagValue(args, "listen", "")
			host, port, err := net.SplitHostPort(listen)
			if err != nil || (host != "" && host != "0.0.0.0") {
				t.Errorf("%s: --listen %q: want :%s (every interface; the default, loopback, is out of the probes' reach)", where, listen, defPort)
				continue
			}
			if port != defPort {
				t.Errorf("%s: --listen %q: the port is not delayq %s's default %s", where, listen, sub, defPort)
			}
			portNum, _ := strconv.Atoi(port)
			portName := ""
			found := false
			for _, p := range c.Ports {
				if p.ContainerPort == portNum {
					found, portName = true, p.Name
				}
			}
			if !found {
				t.Errorf("%s: no containerPort %d (the --listen port)", where, portNum)
			}
			for _, pr := range []struct {
				kind, path string
				probe      *k8sProbe
				required   bool
			}{
				{"startupProbe", "/healthz", c.StartupProbe, false},
				{"livenessProbe", "/healthz", c.LivenessProbe, true},
				{"readinessProbe", "/readyz", c.ReadinessProbe, true},
			} {
				if pr.probe == nil {
					if pr.required {
						t.Errorf("%s: no %s", where, pr.kind)
					}
					continue
				}
				if pr.probe.HTTPGet == nil {
					t.Errorf("%s: %s is not an httpGet", where, pr.kind)
					continue
				}
				g := pr.probe.HTTPGet
				if g.Path != pr.path {
					t.Errorf("%s: %s GETs %q, want %s", where, pr.kind, g.Path, pr.path)
				}
				if code, ok := served[g.Path]; !ok || code != http.StatusOK {
					t.Errorf("%s: %s GETs %q, which the admin server does not serve", where, pr.kind, g.Path)
				}
				switch p := g.Port.(type) {
				case int:
					if p != portNum {
						t.Errorf("%s: %s on port %d, want %d", where, pr.kind, p, portNum)
					}
				case string:
					if p != portName || p == "" {
						t.Errorf("%s: %s on port %q, want %q (containerPort %d)", where, pr.kind, p, portName, portNum)
					}
				default:
					t.Errorf("%s: %s port %v", where, pr.kind, g.Port)
				}
			}
			ann := pod.Metadata.Annotations
			if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != port || ann["prometheus.io/path"] != "/metrics" {
				t.Errorf("%s: scrape annotations %v, want prometheus.io/scrape \"true\", port %q, path /metrics", where, ann, port)
			}
			if sub == "worker" {
				st, err := time.ParseDuration(flagValue(args, "shutdown-timeout", flagDefault(t, help, "shutdown-timeout")))
				if err != nil {
					t.Fatal(err)
				}
				if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= st {
					t.Errorf("%s: terminationGracePeriodSeconds %v: want more than --shutdown-timeout %v", where, g, st)
				}
			}
			replicas := 1
			if o.Spec.Replicas != nil {
				replicas = *o.Spec.Replicas
			}
			if sub == "relay" {
				relays++
				if replicas < 2 {
					t.Errorf("%s: %d relay replicas, want more than one", where, replicas)
				}
			}
			if replicas > 1 && !hasPDB(pdbs, pod.Metadata.Labels) {
				t.Errorf("%s: no PodDisruptionBudget selects its pods", where)
			}
			if !labelsMatch(o.Spec.Selector.MatchLabels, pod.Metadata.Labels) {
				t.Errorf("%s: selector %v does not match the pod labels %v", where, o.Spec.Selector.MatchLabels, pod.Metadata.Labels)
			}
		}
	}
	if relays == 0 {
		t.Error("no relay Deployment in the manifests")
	}
	checkScaledObjects(t, objs)

	for _, o := range objs {
		if o.Kind != "Kustomization" {
			continue
		}
		var k struct {
			Resources []string `yaml:"resources"`
		}
		b, _ := os.ReadFile(filepath.Join(manifestDir, o.file))
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatal(err)
		}
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(manifestDir, filepath.Dir(o.file), r)); err != nil {
				t.Errorf("%s lists %s: %v", o.file, r, err)
			}
		}
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func hasPDB(pdbs map[string]k8sObject, podLabels map[string]string) bool {
	for _, p := range pdbs {
		if labelsMatch(p.Spec.Selector.MatchLabels, podLabels) {
			return true
		}
	}
	return false
}

// readmeMetrics lists the metric names of README's Metrics table.
func readmeMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(delayq_[a-z_]+)(?:\\{[^}]*\\})?` \\|").FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
	}
	if len(names) < 5 {
		t.Fatalf("found %d metrics in README.md's Metrics table; the table or this parser changed", len(names))
	}
	return names
}

// TestAlertRules: docs/alerts.yaml is a Prometheus rule file whose expressions
// use only the metrics README documents, and the ConfigMap and PrometheusRule
// under deploy/kubernetes hold the same rules.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docs/alerts.yaml: %v", err)
	}
	known := readmeMetrics(t)
	metric := regexp.MustCompile(`\bdelayq_[a-z_]+`)
	rules := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			rules++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %q in group %s: want alert, expr, labels.severity and annotations.summary", r.Alert, g.Name)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rule %s: for %q: %v", r.Alert, r.For, err)
				}
			}
			for _, m := range metric.FindAllString(r.Expr, -1) {
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(m, suf); ok && slices.Contains(known, s) {
						base = s
					}
				}
				if !slices.Contains(known, base) {
					t.Errorf("rule %s uses %s, which README's Metrics table does not list", r.Alert, m)
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("docs/alerts.yaml has no rules")
	}

	var want map[string]any
	if err := yaml.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	var haveCM, haveRule bool
	for _, o := range readManifests(t) {
		switch o.Kind {
		case "ConfigMap":
			for key, v := range o.Data {
				var got map[string]any
				if err := yaml.Unmarshal([]byte(v), &got); err != nil {
					t.Errorf("%s: ConfigMap %s, %s: %v", o.file, o.Metadata.Name, key, err)
					continue
				}
				if _, ok := got["groups"]; ok {
					haveCM = true
					if !reflect.DeepEqual(got, want) {
						t.Errorf("%s: ConfigMap %s, %s differs from docs/alerts.yaml: copy the file in again", o.file, o.Metadata.Name, key)
					}
				}
			}
		case "PrometheusRule":
			haveRule = true
			if !reflect.DeepEqual(o.Spec.Groups, want["groups"]) {
				t.Errorf("%s: PrometheusRule %s: spec.groups differ from docs/alerts.yaml's groups: copy them in again", o.file, o.Metadata.Name)
			}
		}
	}
	if !haveCM || !haveRule {
		t.Errorf("deploy/kubernetes: alert rules in a ConfigMap %v, in a PrometheusRule %v; want both", haveCM, haveRule)
	}
}
