package bench

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes is the CPU time used so far by this process (the worker, and
// whatever else the workload runs in it), by Postgres (the postmaster, its live
// children and those it reaped) and by Redis (INFO cpu). A part that cannot be
// read (Postgres on another machine, say) is negative. redisCmds counts the
// script calls Redis answered (EVAL and EVALSHA; the commands a script runs are
// not counted). kernel is the part of the three spent in the kernel (their system
// time), negative when a part cannot be read.
type cpuTimes struct {
	self, postgres, redis, kernel time.Duration
	redisCmds                     int64
}

// cpu reads the CPU times now; the difference of two readings, divided by the
// tasks run between them, is a phase's CPU per task, split by process: steadier
// than a rate on a loaded machine.
func (s *session) cpu(ctx context.Context) cpuTimes {
	c := cpuTimes{self: -1, postgres: -1, redis: -1, kernel: -1, redisCmds: -1}
	var selfSys, redisSys, pgSys time.Duration
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		selfSys = time.Duration(ru.Stime.Nano())
	}
	if info, err := s.rdb.Info(ctx, "cpu", "commandstats").Result(); err == nil {
		var sum, sys float64
		n := 0
		for _, line := range strings.Split(info, "\r\n") {
			for _, k := range []string{"cmdstat_eval:calls=", "cmdstat_evalsha:calls="} {
				if v, ok := strings.CutPrefix(line, k); ok {
					v, _, _ = strings.Cut(v, ",")
					if n, err := strconv.ParseInt(v, 10, 64); err == nil {
						c.redisCmds = max(c.redisCmds, 0) + n
					}
				}
			}
			for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(line, k); ok {
					if f, err := strconv.ParseFloat(v, 64); err == nil {
						sum += f
						n++
						if k == "used_cpu_sys:" {
							sys = f
						}
					}
				}
			}
		}
		if n == 2 {
			c.redis = time.Duration(sum * float64(time.Second))
			redisSys = time.Duration(sys * float64(time.Second))
		}
	}
	var dir string
	if s.pool.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir) == nil {
		c.postgres, pgSys = postmasterCPU(dir)
	}
	if c.self >= 0 && c.redis >= 0 && c.postgres >= 0 {
		c.kernel = selfSys + redisSys + pgSys
	}
	return c
}

// postmasterCPU is the CPU time of the postmaster whose data directory is dir,
// with its children's (live ones from /proc, reaped ones as its cutime/cstime);
// and the system part of it; -1 when it cannot be read (not Linux, not our user,
// another machine).
func postmasterCPU(dir string) (total, sys time.Duration) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return -1, -1
	}
	pid, _, _ := strings.Cut(string(b), "\n")
	own, sys, ok := procCPU(pid, true)
	if !ok {
		return -1, -1
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return -1, -1
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if f := statFields(string(st)); len(f) > 14 && f[1] == pid {
			t, ts, _ := procCPU(e.Name(), false)
			own += t
			sys += ts
		}
	}
	return own, sys
}

// procCPU is utime+stime of a process (with cutime+cstime when reaped), and the
// system part: stime (+cstime).
func procCPU(pid string, reaped bool) (total, sys time.Duration, ok bool) {
	st, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, false
	}
	f := statFields(string(st))
	if len(f) < 15 {
		return 0, 0, false
	}
	last := 12
	if reaped {
		last = 14
	}
	var ticks, sysTicks int64
	for i := 11; i <= last; i++ {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, 0, false
		}
		ticks += v
		if i == 12 || i == 14 { // stime, cstime
			sysTicks += v
		}
	}
	const tick = time.Second / 100 // USER_HZ is 100 on Linux
	return time.Duration(ticks) * tick, time.Duration(sysTicks) * tick, true
}

// statFields splits /proc/PID/stat after the command name (which may hold
// spaces): f[0] is the state, f[1] the parent's pid, f[11..14] utime, stime,
// cutime, cstime in clock ticks.
func statFields(st string) []string {
	i := strings.LastIndexByte(st, ')')
	if i < 0 || i+2 > len(st) {
		return nil
	}
	return strings.Fields(st[i+2:])
}

// childrenCPU is the CPU time of this process's children that have ended and
// been waited for (pgbench, say): user and system.
func childrenCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// addCPU records the CPU per task between two readings, for each part read.
func (r *Result) addCPU(prefix string, before, after cpuTimes, tasks int) {
	for _, p := range []struct {
		name string
		b, a time.Duration
	}{
		{"go", before.self, after.self}, {"postgres", before.postgres, after.postgres}, {"redis", before.redis, after.redis},
		{"kernel", before.kernel, after.kernel}, // the system time of the three, included in them
	} {
		if p.b >= 0 && p.a >= 0 && tasks > 0 {
			// max: a Postgres child that exited between the readings and was not
			// reaped yet is in neither; rare, and never below zero.
			r.add(prefix+"_cpu_"+p.name, float64(max(p.a-p.b, 0))/float64(time.Microsecond)/float64(tasks), "µs/task")
		}
	}
	if before.redisCmds >= 0 && after.redisCmds >= 0 && tasks > 0 {
		r.add(prefix+"_redis_scripts", float64(after.redisCmds-before.redisCmds)/float64(tasks), "calls/task")
	}
}
