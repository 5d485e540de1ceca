package main

import (
	"bytes"
	"testing"
)

// TestRunGivenURLs: with both URLs given, withservers starts nothing, runs the
// command with the environment as it is and exits with the command's code.
func TestRunGivenURLs(t *testing.T) {
	t.Setenv("DELAYQ_TEST_POSTGRES_URL", "postgres://given/db")
	t.Setenv("DELAYQ_TEST_REDIS_URL", "redis://given:6379/0")
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"success", []string{"--env", "test", "--", "sh", "-c", `test "$DELAYQ_TEST_POSTGRES_URL" = postgres://given/db`}, 0},
		{"the command's exit code", []string{"--", "sh", "-c", "exit 3"}, 3},
		{"no command", []string{"--env", "test"}, 2},
		{"unknown variable set", []string{"--env", "prod", "--", "true"}, 2},
		{"a command that does not exist", []string{"--", "/nonexistent/delayq-withservers-test"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if got := run(tc.args, &stderr); got != tc.want {
				t.Errorf("run(%q) = %d, want %d; stderr:\n%s", tc.args, got, tc.want, stderr.String())
			}
		})
	}
}
