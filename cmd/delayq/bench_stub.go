//go:build !delayqdev

package main

import (
	"context"
	"fmt"
)

// benchSummary is bench's line in the command list.
const benchSummary = "benchmark workloads: not in this binary (make bench, or build with -tags " + devTag + ")"

// runBench, in a binary built without -tags delayqdev, explains where the
// benchmarks are: they start throwaway servers and run pgbench, so they live in
// the development build only.
func runBench(_ context.Context, m *Main, args []string) error {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprintf(m.Stdout, "Usage: delayq bench [flags] [workload ...]\n\n"+
				"The benchmark workloads are not part of this binary. In a checkout of delayq run\n"+
				"  make bench\nor\n  go run -tags %s ./cmd/delayq bench --help\n", devTag)
			return errHelp
		}
	}
	return usagef("the benchmark workloads are not part of this binary: run `make bench` in a checkout of delayq, "+
		"or build with -tags %s", devTag)
}
