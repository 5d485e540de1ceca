//go:build delayqdev

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"

	"github.com/delayq/delayq/internal/bench"
	"github.com/delayq/delayq/internal/dispatch"
)

// benchSummary is bench's line in the command list.
// maxSoakGroupCommit is delayq's bound on GroupCommit.MaxTasks (64: the
// subtransactions Postgres keeps per transaction in shared memory), checked
// here before connecting; the client checks it again.
const maxSoakGroupCommit = 64

const benchSummary = "run the benchmark workloads and print their figures"

func runBench(ctx context.Context, m *Main, args []string) error {
	var conn connFlags
	var about strings.Builder
	for _, w := range bench.Workloads() {
		fmt.Fprintf(&about, "  %-20s %s\n", w, bench.About(w))
	}
	fs := newFlagSet(m, "bench", "bench [flags] [workload ...]",
		"  delayq bench                       # every workload on throwaway servers (fsync on)\n"+
			"  delayq bench --json relay memory   # two workloads, one JSON line each\n"+
			"  delayq bench --scale 0.01          # tiny sizes, as CI runs it\n"+
			"  delayq bench soak                  # 10 minutes of steady load (never part of a full run)\n\nWorkloads:\n"+about.String())
	conn.register(fs, m, true, true)
	asJSON := fs.Bool("json", false, "print one JSON line per workload")
	scale := fs.Float64("scale", 1, "multiply every workload's task count (1 = documented size)")
	controls := fs.Bool("claim-controls", false, "give the workloads' queue a rate limit that never binds (10^6/s): the claim script's cost with its limiter at work")
	rateBurst := fs.Int("rate-burst", 0, "the rate-limit workload's burst (0: the default, 100ms of starts at the limit)")
	shards := fs.Int("shards", 0, fmt.Sprintf("the sharded workload's shard count (0: 3; at most %d)", dispatch.MaxShards))
	relayRate := fs.Int("relay-rate", 0, "the relay workload's steady load while its lag is measured, tasks a second for 10s (0: 2000; at most 20000)")
	var soak bench.Soak
	fs.IntVar(&soak.Rate, "soak-rate", 0, "soak: tasks committed a second (0: 500 times --scale)")
	fs.DurationVar(&soak.Duration, "soak-duration", 0, "soak: how long the steady load lasts (0: 10m times --scale)")
	fs.DurationVar(&soak.SampleEvery, "soak-sample", 0, "soak: time between samples (0: a twentieth of the run)")
	fs.DurationVar(&soak.Retention, "soak-retention", 0, "soak: the relay's Retention, how long finished rows are kept (0: 5s)")
	fs.DurationVar(&soak.RetentionInterval, "soak-retention-interval", 0, "soak: the relay's RetentionInterval (0: 1s)")
	fs.IntVar(&soak.RetentionBatch, "soak-retention-batch", 0, "soak: the relay's RetentionBatch, rows a delete (0: the relay's default)")
	fs.IntVar(&soak.GroupCommit, "soak-group-commit", 0, fmt.Sprintf("soak: commit up to this many runs a transaction, 256 slots (0: a commit a run, 32 slots; at most %d)", maxSoakGroupCommit))
	soakOut := fs.String("soak-samples", "", "soak: append each sample to this file as a JSON line")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run (this process: relay, workers, producers) to this file")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *scale <= 0 || *scale > 10 {
		return usagef("--scale %v: want 0 < scale <= 10", *scale)
	}
	if *shards < 0 || *shards > dispatch.MaxShards {
		return usagef("--shards %d: want 0..%d", *shards, dispatch.MaxShards)
	}
	if *relayRate < 0 || *relayRate > 20000 {
		return usagef("--relay-rate %d: want 0..20000", *relayRate)
	}
	if soak.Rate < 0 || soak.Duration < 0 || soak.SampleEvery < 0 || soak.Retention < 0 || soak.RetentionInterval < 0 ||
		soak.RetentionBatch < 0 || soak.RetentionBatch > 100000 || soak.GroupCommit < 0 || soak.GroupCommit > maxSoakGroupCommit {
		return usagef("--soak-* flags: want durations and counts >= 0, --soak-retention-batch <= 100000, --soak-group-commit <= %d", maxSoakGroupCommit)
	}
	names := fs.Args()
	if len(names) == 0 {
		names = bench.FullRun()
	}
	for _, n := range names {
		if bench.About(n) == "" {
			return usagef("unknown workload %q (known: %s)", n, strings.Join(bench.Workloads(), ", "))
		}
	}
	if err := conn.checkURLs(); err != nil {
		return err
	}
	stop, err := m.throwawayServers(ctx, &conn, true)
	defer stop()
	if err != nil {
		return err
	}
	self, err := os.Executable() // the recovery workload runs `delayq worker` as a process
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *soakOut != "" {
		f, err := os.OpenFile(*soakOut, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		soak.Samples = f
	}
	logger, err := newLogger(m, "text", "info") // soak's samples
	if err != nil {
		return err
	}
	env := bench.Env{DatabaseURL: conn.databaseURL, RedisURL: conn.redisURL, Scale: *scale, WorkerBinary: self, RateBurst: *rateBurst, Shards: *shards, RelayRate: *relayRate, ClaimControls: *controls, Soak: soak, Logger: logger}
	var failed []string
	for _, name := range names {
		res, err := bench.Run(ctx, env, name)
		if err != nil {
			fmt.Fprintf(m.Stderr, "delayq bench: %s\n", oneLine(err.Error()))
			failed = append(failed, name)
			continue
		}
		if *asJSON {
			b, _ := json.Marshal(res)
			fmt.Fprintln(m.Stdout, string(b))
			continue
		}
		printResult(m, res)
	}
	if len(failed) > 0 {
		return fmt.Errorf("workloads failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

func printResult(m *Main, r bench.Result) {
	fmt.Fprintf(m.Stdout, "== %s  (%v)\n", r.Workload, r.Params)
	tw := tabwriter.NewWriter(m.Stdout, 0, 4, 2, ' ', 0)
	for _, f := range r.Figures {
		fmt.Fprintf(tw, "  %s\t%.1f\t%s\n", f.Name, f.Value, f.Unit)
	}
	_ = tw.Flush()
	mc := r.Machine
	fmt.Fprintf(m.Stdout, "  machine: %d cores, %s; %s; PostgreSQL %s (fsync %s); Redis %s\n",
		mc.Cores, mc.CPU, mc.Go, mc.Postgres, mc.Durable, mc.Redis)
}
