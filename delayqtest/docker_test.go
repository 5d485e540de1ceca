//go:build linux

package delayqtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/delayqtest"
	"github.com/delayq/delayq/internal/tempserver/fakedocker"
	"github.com/delayq/delayq/outbox"
)

// With no URL set and DELAYQ_TEST_SERVERS=docker, a test process starts its
// servers in containers through the docker command, runs on them, and Main
// removes the containers when the tests end. The test runs this binary again
// as that process (the servers are once per process), with fakedocker as the
// docker command: real servers behind a stand-in for the container runtime.
func TestServersInDocker(t *testing.T) {
	if os.Getenv("DELAYQ_DOCKER_CHILD") != "" {
		dockerChild(t)
		return
	}
	if testing.Short() {
		t.Skip("a test process of its own with servers of its own: make test runs it")
	}
	state := fakedocker.Install(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestServersInDocker$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "DELAYQ_DOCKER_CHILD=1", "DELAYQ_TEST_SERVERS=docker",
		delayqtest.EnvPostgresURL+"=", delayqtest.EnvRedisURL+"=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ran in containers") {
		t.Fatalf("the test process on Docker: %v\n%s", err, out)
	}
	if running := fakedocker.Running(state); len(running) != 0 {
		t.Errorf("containers left running after Main: %v", running)
	}

	// A bad setting is refused with the variable's name.
	cmd = exec.Command(os.Args[0], "-test.run=^TestServersInDocker$", "-test.count=1")
	cmd.Env = append(os.Environ(), "DELAYQ_DOCKER_CHILD=1", "DELAYQ_TEST_SERVERS=podman",
		delayqtest.EnvPostgresURL+"=", delayqtest.EnvRedisURL+"=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), `DELAYQ_TEST_SERVERS: tempserver: invalid server source "podman"`) {
		t.Errorf("DELAYQ_TEST_SERVERS=podman: %v\n%s", err, out)
	}
}

func dockerChild(t *testing.T) {
	e := delayqtest.New(t, delayqtest.Options{})
	c := e.Client(t, delayq.Config{})
	ctx := context.Background()
	ran := false
	if err := delayq.Register(c, charges, func(context.Context, *delayq.Task, charge) error {
		ran = true
		return nil
	}, delayq.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := charges.Enqueue(ctx, c, e.Pool, outbox.Task{ID: "o-1", Delay: time.Hour}, charge{"o-1", 100}); err != nil {
		t.Fatal(err)
	}
	if res := e.Work(ctx, t, c, "charge", "o-1"); res.Outcome != delayq.OutcomeSucceeded || !ran {
		t.Fatalf("o-1: %+v", res)
	}
	if running := fakedocker.Running(os.Getenv(fakedocker.EnvState)); len(running) != 2 {
		t.Fatalf("containers running: %v, want PostgreSQL's and Redis's", running)
	}
	t.Log("ran in containers")
}
