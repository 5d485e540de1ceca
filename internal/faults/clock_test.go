package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/internal/testenv"
)

// A worker whose clock is five minutes off Redis's, either way, never starts a
// task early and does not wait for its own clock either: claims are decided by
// the Redis clock alone.
//
// The skew is real: Redis runs with a small LD_PRELOAD shim (built here with the
// C compiler) that shifts its wall clock (gettimeofday, clock_gettime
// CLOCK_REALTIME, time) by the offset, so that TIME and the scripts' clock are
// minutes away from this process's, where the worker and the relay run. Tasks
// are enqueued due 0..3s ahead on the Redis clock. A worker that trusted its own
// clock would start them all at once (clock ahead) or five minutes late (clock
// behind). Besides, a hook on the worker's Redis client checks that it never
// sends a time to Redis, so its clock cannot enter a claim.
func TestClockSkew(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the clock shim uses LD_PRELOAD, on Linux")
	}
	shim := buildClockShim(t)
	for _, tc := range []struct {
		name   string
		offset time.Duration // the Redis clock minus the worker's
	}{
		{"worker-ahead", -5 * time.Minute},
		{"worker-behind", 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSystem(t, "clock-"+tc.name, testenv.PostgresURL(t), startSkewedRedis(t, shim, tc.offset))
			ctx := s.ctx()
			measured, err := measureSkew(ctx, s.rdb)
			if err != nil {
				t.Fatal(err)
			}
			if d := measured - tc.offset; d < -2*time.Second || d > 2*time.Second {
				t.Fatalf("Redis clock is %v off ours, want %v: the shim did not work", measured, tc.offset)
			}
			// Both clocks are the kernel's, one shifted by whole seconds: the skew is
			// the offset exactly (a measurement would be off by up to half a round
			// trip, tens of ms on a loaded machine).
			skew := tc.offset
			guard := &timeArgGuard{skew: skew}
			s.runRelay("relay")
			s.runWorker("worker", guard)
			l := s.newLoad(400, 3*time.Second)
			// Due times on the Redis clock, as a producer that knows it would set them.
			l.runAt = func(d time.Duration) time.Time { return time.Now().Add(skew + d) }
			wait(ctx, l.start(ctx))
			// A worker waiting for its own clock would be five minutes late; allow a
			// fifth of that to a loaded machine.
			s.check(ctx, l, checkOpts{faults: 1, skew: skew, maxLateness: time.Minute})

			if f := guard.found(); len(f) > 0 {
				t.Errorf("the worker sent times to Redis (its clock could enter a claim): %v", f)
			}
			// Every run started when the worker's own clock said the task was due
			// minutes ago (ahead) or in minutes (behind).
			effects, err := s.effects(ctx)
			if err != nil {
				t.Fatal(err)
			}
			runs, fooled := 0, 0
			for _, es := range effects {
				for _, e := range es {
					runs++
					localLead := e.due.Sub(e.localAt) // > 0: the local clock says "not yet due"
					if tc.offset > 0 && localLead < tc.offset-time.Minute || tc.offset < 0 && localLead > tc.offset+time.Minute {
						fooled++
					}
				}
			}
			if runs == 0 || fooled > 0 {
				t.Errorf("%d runs, %d of them at a local time that does not show the skew", runs, fooled)
			}
		})
	}
}

// shimSource shifts the wall clock of a dynamically linked program by
// DELAYQ_CLOCK_OFFSET seconds; monotonic clocks are left alone.
const shimSource = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long offset(void) {
	static int done;
	static long off;
	if (!done) {
		const char *s = getenv("DELAYQ_CLOCK_OFFSET");
		off = s ? atol(s) : 0;
		done = 1;
	}
	return off;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	static int (*real)(struct timeval *restrict, void *restrict);
	if (!real) real = dlsym(RTLD_NEXT, "gettimeofday");
	int r = real(tv, tz);
	if (r == 0 && tv) tv->tv_sec += offset();
	return r;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
	static int (*real)(clockid_t, struct timespec *);
	if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
	int r = real(id, ts);
	if (r == 0 && ts && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
	return r;
}

time_t time(time_t *t) {
	struct timeval tv;
	gettimeofday(&tv, NULL);
	if (t) *t = tv.tv_sec;
	return tv.tv_sec;
}
`

// buildClockShim compiles the shim into a shared library.
func buildClockShim(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		if cc, err = exec.LookPath("gcc"); err != nil {
			t.Fatalf("a C compiler (cc or gcc) is needed to build the clock shim: %v", err)
		}
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "skew.c"), filepath.Join(dir, "skew.so")
	if err := os.WriteFile(src, []byte(shimSource), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, src, "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("build the clock shim: %v\n%s", err, out)
	}
	return lib
}

// startSkewedRedis starts a Redis server (no persistence) whose clock is offset
// from ours, stopped when the test ends, and returns its URL.
func startSkewedRedis(t *testing.T, shim string, offset time.Duration) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--daemonize", "no")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+shim, "DELAYQ_CLOCK_OFFSET="+strconv.Itoa(int(offset.Seconds())))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
	})
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	rdb, err := newRedis(url)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return url
		}
		if time.Now().After(deadline) {
			t.Fatalf("skewed Redis not ready: %v; log:\n%s", err, readTail(filepath.Join(dir, "redis.log"), 2000))
		}
		pause(context.Background(), 20*time.Millisecond)
	}
}

// measureSkew returns the Redis clock minus ours, to within the round trip.
func measureSkew(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	before := time.Now()
	rt, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	after := time.Now()
	mid := before.Add(after.Sub(before) / 2)
	return rt.Sub(mid), nil
}

// timeArgGuard is a go-redis hook that notes every argument of a command that
// reads as a time within a day of now, in Unix seconds or milliseconds, on our
// clock or Redis's.
type timeArgGuard struct {
	skew time.Duration

	mu    sync.Mutex
	finds []string
}

func (g *timeArgGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *timeArgGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.inspect(cmd)
		return next(ctx, cmd)
	}
}

func (g *timeArgGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			g.inspect(c)
		}
		return next(ctx, cmds)
	}
}

func (g *timeArgGuard) inspect(cmd redis.Cmder) {
	now := time.Now()
	for i, a := range cmd.Args() {
		if i == 0 {
			continue
		}
		var f float64
		switch v := a.(type) {
		case string:
			x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				continue
			}
			f = x
		case int:
			f = float64(v)
		case int64:
			f = float64(v)
		case float64:
			f = v
		case time.Time:
			g.note(cmd)
			continue
		default:
			continue
		}
		for _, ref := range []time.Time{now, now.Add(g.skew)} {
			sec, ms := float64(ref.Unix()), float64(ref.UnixMilli())
			if f > sec-86400 && f < sec+86400 || f > ms-86400e3 && f < ms+86400e3 {
				g.note(cmd)
				break
			}
		}
	}
}

func (g *timeArgGuard) note(cmd redis.Cmder) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.finds) < 5 {
		g.finds = append(g.finds, fmt.Sprint(cmd.Args()))
	}
}

func (g *timeArgGuard) found() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.finds...)
}
