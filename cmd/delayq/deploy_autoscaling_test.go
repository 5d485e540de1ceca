package main

import (
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/forecast"
)

// The parts of a KEDA ScaledObject and of a Service the check reads.
type k8sScaledObject struct {
	Spec struct {
		ScaleTargetRef struct {
			Kind string `yaml:"kind"`
			Name string `yaml:"name"`
		} `yaml:"scaleTargetRef"`
		MinReplicaCount *int `yaml:"minReplicaCount"`
		MaxReplicaCount *int `yaml:"maxReplicaCount"`
		Fallback        *struct {
			FailureThreshold int `yaml:"failureThreshold"`
			Replicas         int `yaml:"replicas"`
		} `yaml:"fallback"`
		Triggers []struct {
			Type       string            `yaml:"type"`
			MetricType string            `yaml:"metricType"`
			Metadata   map[string]string `yaml:"metadata"`
		} `yaml:"triggers"`
	} `yaml:"spec"`
}

type k8sService struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// checkScaledObjects is TestKubernetesManifests' part for KEDA
// (deploy/kubernetes/autoscaling): each ScaledObject scales a Deployment of
// its directory that runs delayq worker and leaves its replicas to the HPA;
// each metrics-api trigger reads desiredWorkers (targetValue 1, AverageValue:
// the value is the replica count) from /forecast through a Service that reaches
// a relay's admin port; its query is one the relay accepts (forecast.ParseQuery),
// names the worker's queues and its --concurrency; and the relay runs with
// the forecast on.
func checkScaledObjects(t *testing.T, objs []k8sObject) {
	t.Helper()
	found := 0
	for _, o := range objs {
		if o.Kind != "ScaledObject" {
			continue
		}
		found++
		where := o.file + ": ScaledObject " + o.Metadata.Name
		if o.APIVersion != "keda.sh/v1alpha1" {
			t.Errorf("%s: apiVersion %q, want keda.sh/v1alpha1", where, o.APIVersion)
		}
		var so k8sScaledObject
		if err := o.node.Decode(&so); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		ref := so.Spec.ScaleTargetRef
		if ref.Kind != "" && ref.Kind != "Deployment" {
			t.Errorf("%s: scales a %s, want a Deployment", where, ref.Kind)
		}
		target, ok := findObject(objs, "Deployment", ref.Name, filepath.Dir(o.file))
		if !ok {
			t.Errorf("%s: scaleTargetRef %q: no Deployment of that name beside it", where, ref.Name)
			continue
		}
		if target.Spec.Replicas != nil {
			t.Errorf("%s: Deployment %s sets replicas: the HPA KEDA makes owns them, and an apply would reset them", where, ref.Name)
		}
		var workerArgs []string
		for _, c := range target.Spec.Template.Spec.Containers {
			if a := delayqArgs(c); len(a) > 0 && a[0] == "worker" {
				workerArgs = a
			}
		}
		if workerArgs == nil {
			t.Errorf("%s: Deployment %s runs no delayq worker", where, ref.Name)
			continue
		}
		minR, maxR := 0, 0
		if so.Spec.MinReplicaCount != nil {
			minR = *so.Spec.MinReplicaCount
		}
		if so.Spec.MaxReplicaCount == nil || *so.Spec.MaxReplicaCount < max(minR, 1) {
			t.Errorf("%s: maxReplicaCount %v: want one, at least minReplicaCount %d", where, so.Spec.MaxReplicaCount, minR)
		} else {
			maxR = *so.Spec.MaxReplicaCount
		}
		if f := so.Spec.Fallback; f == nil || f.FailureThreshold < 1 || f.Replicas < 1 || f.Replicas > maxR {
			t.Errorf("%s: fallback %+v: want one (the relay answers 503 when its forecast is stale), within maxReplicaCount", where, f)
		}
		triggers := 0
		for _, tr := range so.Spec.Triggers {
			if tr.Type != "metrics-api" {
				continue
			}
			triggers++
			checkForecastTrigger(t, objs, where, tr.MetricType, tr.Metadata, workerArgs)
		}
		if triggers == 0 {
			t.Errorf("%s: no metrics-api trigger", where)
		}
	}
	if found == 0 {
		t.Error("no ScaledObject in the manifests (deploy/kubernetes/autoscaling)")
	}
}

func checkForecastTrigger(t *testing.T, objs []k8sObject, where, metricType string, md map[string]string, workerArgs []string) {
	t.Helper()
	if metricType != "" && metricType != "AverageValue" {
		t.Errorf("%s: metricType %q: want AverageValue (the metrics-api default), which the fallback needs", where, metricType)
	}
	if f := md["format"]; f != "" && f != "json" {
		t.Errorf("%s: format %q, want json", where, f)
	}
	if md["valueLocation"] != "desiredWorkers" {
		t.Errorf("%s: valueLocation %q, want desiredWorkers (of the queues asked)", where, md["valueLocation"])
	}
	if v, err := strconv.ParseFloat(md["targetValue"], 64); err != nil || v != 1 {
		t.Errorf("%s: targetValue %q: want 1, so that the replicas are desiredWorkers", where, md["targetValue"])
	}
	u, err := url.Parse(md["url"])
	if err != nil || u.Scheme != "http" || u.Path != forecast.Path {
		t.Errorf("%s: url %q: want http://<the relays' Service>:<port>%s?… (%v)", where, md["url"], forecast.Path, err)
		return
	}
	p, queues, err := forecast.ParseQuery(u.Query(), forecast.Params{}, nil)
	if err != nil {
		t.Errorf("%s: url %q: the relay would answer 400: %v", where, md["url"], err)
		return
	}
	workerQueues := strings.Split(flagValue(workerArgs[1:], "queue", ""), ",")
	slices.Sort(workerQueues)
	asked := slices.Sorted(slices.Values(queues))
	if !slices.Equal(slices.Compact(asked), workerQueues) {
		t.Errorf("%s: url asks the queues %v, the worker serves %v", where, asked, workerQueues)
	}
	conc, _ := strconv.Atoi(flagValue(workerArgs[1:], "concurrency", flagDefault(t, commandHelp(t, "worker"), "concurrency")))
	if p.Concurrency != conc {
		t.Errorf("%s: url's concurrency %d, the worker's --concurrency %d", where, p.Concurrency, conc)
	}

	// The host is a Service (<name>[.<namespace>.svc.cluster.local]) whose port
	// leads to a relay's admin port, with the forecast on.
	svcName, _, _ := strings.Cut(u.Hostname(), ".")
	svcObj, ok := findObject(objs, "Service", svcName, "")
	if !ok {
		t.Errorf("%s: url host %q: no Service %s in the manifests", where, u.Host, svcName)
		return
	}
	var svc k8sService
	if err := svcObj.node.Decode(&svc); err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	reached := false
	for _, relay := range objs {
		if relay.Kind != "Deployment" || !labelsMatch(svc.Spec.Selector, relay.Spec.Template.Metadata.Labels) {
			continue
		}
		for _, c := range relay.Spec.Template.Spec.Containers {
			args := delayqArgs(c)
			if len(args) == 0 || args[0] != "relay" {
				continue
			}
			if v := flagValue(args[1:], "forecast-interval", ""); v == "0" || v == "0s" {
				t.Errorf("%s: relay %s runs with --forecast-interval %s: no /forecast", where, relay.Metadata.Name, v)
			}
			_, listenPort, _ := net.SplitHostPort(flagValue(args[1:], "listen", ""))
			for _, sp := range svc.Spec.Ports {
				if sp.Port != port {
					continue
				}
				for _, cp := range c.Ports {
					if strconv.Itoa(cp.ContainerPort) == listenPort && (sp.TargetPort == cp.Name || sp.TargetPort == cp.ContainerPort) {
						reached = true
					}
				}
			}
		}
	}
	if !reached {
		t.Errorf("%s: url %q: Service %s's port %d leads to no relay's --listen port", where, md["url"], svcName, port)
	}
}

// findObject finds the object of kind and name, in dir when dir is not empty.
func findObject(objs []k8sObject, kind, name, dir string) (k8sObject, bool) {
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name && (dir == "" || filepath.Dir(o.file) == dir) {
			return o, true
		}
	}
	return k8sObject{}, false
}
