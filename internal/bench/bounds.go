package bench

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/delayq/delayq/delayq"
	"github.com/delayq/delayq/internal/clientkit"
	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/internal/tempserver"
	"github.com/delayq/delayq/outbox"
)

// bounds measures, on the same servers, the ceilings BENCHMARKS.md reads the
// transactional workloads against: pgbench running enqueue-tx's transaction (8
// clients), drain-tx's (32 clients: the guard alone, as the worker sends it for a
// handler that wrote nothing) and drain-tx-write's (32 clients: BEGIN with the
// handler's insert, then the guard with COMMIT, each pair pipelined, as the worker
// sends them), the group-commit workloads' (8 clients, groups of 64 runs, in
// tasks/s: drain-tx-group's group of no-op runs is its guards' one statement;
// drain-tx-write-group's is a round trip a run, its savepoint with its insert,
// then the guards with the COMMIT), the writing group in one round trip (what its
// round trips a run cost), and redis-benchmark running the three-command
// script (32 clients). The SQL is captured from a real Enqueue and real worker
// runs, so it is delayq's, whatever it becomes. These are what Postgres and Redis do alone: no
// delayq process runs meanwhile.
func bounds(ctx context.Context, s *session, r *Result) error {
	pgbench, err := findPgbench()
	if err != nil {
		return err
	}
	secs := max(1, int(5*s.env.Scale+0.5))
	rows := s.n(400_000)
	r.Params["seconds_each"], r.Params["guard_rows"] = secs, rows

	if _, err := s.pool.Exec(ctx, writeDDL); err != nil {
		return err
	}
	enq, guardAlone, guardWrite, guardGroup, err := s.captureSQL(ctx)
	if err != nil {
		return err
	}
	// Rows for the guard to complete, as the relay leaves them: 1..rows for
	// drain-tx's script, rows+1..2*rows for drain-tx-write's. A random row a
	// transaction: rows drawn twice (about 7 % at 12,000 tx/s for 5 s) are done
	// already and update nothing, so the guard's division by zero in a writing
	// run's transaction (which aborts the worker's transaction) is left out, or it
	// would end the pgbench client.
	if _, err := s.pool.Exec(ctx, `INSERT INTO `+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()+` (queue, task_id, run_at, payload, max_attempts, state)
SELECT 'bound', 'g-' || g, now(), $1, 25, 'queued' FROM generate_series(1, 4 * $2::int) AS g`, payload20, rows); err != nil {
		return err
	}
	if _, err := s.pool.Exec(ctx, "VACUUM ANALYZE "+taskstate.New(taskstate.Config{Schema: s.ob.Config().Schema}).Table()); err != nil {
		return err
	}
	_, _ = s.pool.Exec(ctx, "CHECKPOINT")

	dir, err := os.MkdirTemp("", "delayq-bounds-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	guardNoAbort := strings.Replace(guardWrite, "SELECT 1 / count(*)", "SELECT count(*)", 1)
	if guardNoAbort == guardWrite {
		return errors.New("bounds: the worker's guard of a writing run no longer ends in SELECT 1 / count(*)")
	}
	// pgbench's connections do not have the session's search_path.
	qualified := strings.Replace(writeSQL, writeTable, pgx.Identifier{s.schema, writeTable}.Sanitize(), 1)
	write, err := withLiterals(qualified, []any{"id"}, map[string]string{"id": "('g-' || :id)"})
	if err != nil {
		return err
	}
	guardNoAbort = oneLine(guardNoAbort)
	scripts := map[string]string{
		"enqueue.sql": "\\set id random(1, 1000000000)\nBEGIN;\n" + oneLine(enq) + ";\nCOMMIT;\n",
		"guard.sql":   fmt.Sprintf("\\set id random(1, %d)\n%s;\n", rows, oneLine(guardAlone)),
		"write.sql": fmt.Sprintf("\\set id random(%d, %d)\n"+
			"\\startpipeline\nBEGIN;\n%s;\n\\endpipeline\n"+
			"\\startpipeline\n%s;\nCOMMIT;\n\\endpipeline\n", rows+1, 2*rows, write, guardNoAbort),
	}
	// The group-commit workloads' transactions, as the worker sends them:
	// groupTasks runs on rows 2*rows+1..3*rows (no-op runs: the guards alone) and
	// 3*rows+1..4*rows (writing runs), in blocks of groupTasks.
	// group-write-pipelined.sql sends group-write.sql's statements in one round
	// trip: what Postgres does for the group when the round trips a run are not
	// counted.
	groupTasks := groupCommit.GroupCommit.MaxTasks
	for _, g := range []struct {
		name            string
		first           int
		write, pipeline bool
	}{{"group.sql", 2 * rows, false, false}, {"group-write.sql", 3 * rows, true, false}, {"group-write-pipelined.sql", 3 * rows, true, true}} {
		var b strings.Builder
		fmt.Fprintf(&b, "\\set id random(0, %d)\n", max(rows/groupTasks-1, 0))
		base := fmt.Sprintf("(%d + :id * %d)", g.first+1, groupTasks)
		guards := groupGuard(guardGroup, base, groupTasks)
		if !g.write {
			b.WriteString(guards + ";\n")
			scripts[g.name] = b.String()
			continue
		}
		if g.pipeline {
			b.WriteString("\\startpipeline\n")
		}
		for k := range groupTasks {
			id := fmt.Sprintf("('g-' || (%s + %d))", base, k)
			if !g.pipeline {
				b.WriteString("\\startpipeline\n")
			}
			if k == 0 {
				b.WriteString("BEGIN;\n")
			}
			fmt.Fprintf(&b, "SAVEPOINT delayq_group_%d;\n%s;\n", k, strings.Replace(write, "('g-' || :id)", id, 1))
			if !g.pipeline {
				b.WriteString("\\endpipeline\n")
			}
		}
		if !g.pipeline {
			b.WriteString("\\startpipeline\n")
		}
		b.WriteString(guards + ";\nCOMMIT;\n\\endpipeline\n")
		scripts[g.name] = b.String()
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return err
		}
	}
	for _, b := range []struct {
		figure, script string
		clients        int
	}{
		{"enqueue_tx_bound", "enqueue.sql", 8},
		{"drain_tx_bound", "guard.sql", 32},
		{"drain_tx_write_bound", "write.sql", 32},
		{"drain_tx_group_bound", "group.sql", 8},
		{"drain_tx_write_group_bound", "group-write.sql", 8},
		{"drain_tx_write_group_one_round_trip_bound", "group-write-pipelined.sql", 8},
	} {
		before := s.cpu(ctx)
		client := childrenCPU()
		tps, err := runPgbench(ctx, pgbench, s.env.DatabaseURL, filepath.Join(dir, b.script), b.clients, secs)
		if err != nil {
			return fmt.Errorf("%s: %w", b.figure, err)
		}
		// The CPU a transaction of Postgres and of pgbench (the bound's client, in
		// C), beside the workload's own: on cores the client shares with the
		// server, what the client spends is the server's to lose.
		if after, txs := s.cpu(ctx), tps*float64(secs); before.postgres >= 0 && after.postgres >= 0 && txs > 0 {
			r.add(b.figure+"_cpu_postgres", float64(after.postgres-before.postgres)/float64(time.Microsecond)/txs, "µs/tx")
			r.add(b.figure+"_cpu_client", float64(childrenCPU()-client)/float64(time.Microsecond)/txs, "µs/tx")
		}
		if strings.HasPrefix(b.script, "group") {
			r.add(b.figure, tps*float64(groupTasks), "tasks/s")
			continue
		}
		r.add(b.figure, tps, "tx/s")
	}

	rps, err := s.redisScriptBound(ctx, secs)
	if err != nil {
		return err
	}
	r.add("redis_script_bound", rps, "scripts/s")
	return nil
}

func findPgbench() (string, error) {
	p, err := tempserver.PostgresBinary("pgbench")
	if err != nil {
		return "", fmt.Errorf("bounds needs pgbench (it comes with PostgreSQL): %w", err)
	}
	return p, nil
}

func findRedisBenchmark() (string, error) {
	p, err := tempserver.RedisBinary("redis-benchmark")
	if err != nil {
		return "", fmt.Errorf("bounds needs redis-benchmark (it comes with Redis): %w", err)
	}
	return p, nil
}

// captureSQL runs one real Enqueue in a transaction and three real transactional
// worker runs, one whose handler writes nothing and one that inserts into the
// write table, and one in a group commit, on a pool that records the SQL it
// sends. It returns the enqueue statement and the first two runs' completion
// guards with their arguments written in as literals, the task ids as pgbench
// expressions, and the group's guards as sent (groupGuard writes its arguments).
func (s *session) captureSQL(ctx context.Context) (enqueue, guardAlone, guardWrite, guardGroup string, err error) {
	rec := &sqlRecorder{}
	cfg := s.pool.Config()
	cfg.ConnConfig.Tracer = rec
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", "", "", "", err
	}
	defer pool.Close()

	const enqID, aloneID, writeID, groupID = "bound-enqueue-capture", "bound-guard-capture", "bound-write-capture", "bound-group-capture"
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := s.ob.Enqueue(ctx, tx, outbox.Task{Queue: "bound", ID: enqID, Payload: payload20, Delay: time.Hour})
		return err
	}); err != nil {
		return "", "", "", "", err
	}
	for _, id := range []string{aloneID, writeID, groupID} {
		q := "bound"
		if id == groupID {
			q = "bound-group"
		}
		if _, err := s.ob.Enqueue(ctx, pool, outbox.Task{Queue: q, ID: id, Payload: payload20}); err != nil {
			return "", "", "", "", err
		}
		if _, err := s.dq.Enqueue(ctx, q, dispatch.Task{ID: id, Payload: payload20, Version: 1}); err != nil {
			return "", "", "", "", err
		}
	}
	w, err := clientkit.NewClient(pool, s.dq, s.ob, delayq.WorkerConfig{})
	if err != nil {
		return "", "", "", "", err
	}
	if err := w.HandleTx("bound", func(ctx context.Context, tx pgx.Tx, t *delayq.Task) error {
		if t.ID != writeID {
			return nil
		}
		_, err := tx.Exec(ctx, writeSQL, t.ID)
		return err
	}, delayq.QueueConfig{}); err != nil {
		return "", "", "", "", err
	}
	if err := w.HandleTx("bound-group", func(context.Context, pgx.Tx, *delayq.Task) error { return nil },
		delayq.QueueConfig{GroupCommit: delayq.GroupCommit{MaxTasks: 2, MaxWait: time.Millisecond}}); err != nil {
		return "", "", "", "", err
	}
	stop := s.background(ctx, w.Run)
	err = waitFor(ctx, time.Minute, "the captured runs", func() (bool, error) { return w.RunStats().Succeeded == 3, nil })
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return "", "", "", "", err
	}

	ids := map[string]string{
		enqID:   "('e-' || :client_id || '-' || :id)",
		aloneID: "('g-' || :id)",
		writeID: "('g-' || :id)",
	}
	for _, q := range rec.queries() {
		switch {
		case strings.Contains(q.sql, "INSERT INTO") && containsArg(q.args, enqID):
			enqueue, err = withLiterals(q.sql, q.args, ids)
		case strings.Contains(q.sql, "'done'") && containsArg(q.args, aloneID):
			guardAlone, err = withLiterals(q.sql, q.args, ids)
		case strings.Contains(q.sql, "'done'") && containsArg(q.args, writeID):
			guardWrite, err = withLiterals(q.sql, q.args, ids)
		case strings.Contains(q.sql, "'done'") && len(q.args) == 5 && slices.Equal(anyStrings(q.args[1]), []string{groupID}):
			guardGroup = oneLine(q.sql)
		}
		if err != nil {
			return "", "", "", "", err
		}
	}
	if enqueue == "" || guardAlone == "" || guardWrite == "" || guardGroup == "" {
		return "", "", "", "", errors.New("bounds: did not see the enqueue statement and the worker's three guards")
	}
	return enqueue, guardAlone, guardWrite, guardGroup, nil
}

func anyStrings(v any) []string { s, _ := v.([]string); return s }

// groupGuard writes the arguments of a group's guards (captured with its $1..$5:
// queues, ids, versions, clear payload, wrote) for n runs of queue bound whose
// ids are 'g-' || (base + k), k < n, as a pgbench statement. No run is said to
// have written: a block of rows drawn twice is done already, and the refused
// guard of a run that wrote would abort the transaction and end the pgbench
// client.
func groupGuard(sql, base string, n int) string {
	args := map[string]string{
		"$1": fmt.Sprintf("array_fill('bound'::text, ARRAY[%d])", n),
		"$2": fmt.Sprintf("ARRAY(SELECT 'g-' || (%s + k) FROM generate_series(0, %d) AS k)", base, n-1),
		"$3": fmt.Sprintf("array_fill(1, ARRAY[%d])", n),
		"$4": fmt.Sprintf("array_fill(false, ARRAY[%d])", n),
		"$5": fmt.Sprintf("array_fill(false, ARRAY[%d])", n),
	}
	return placeholder.ReplaceAllStringFunc(sql, func(p string) string { return args[p] })
}

// sqlRecorder is a pgx tracer that keeps every statement and its arguments.
type sqlRecorder struct {
	mu   sync.Mutex
	seen []recorded
}

type recorded struct {
	sql  string
	args []any
}

func (t *sqlRecorder) add(sql string, args []any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen = append(t.seen, recorded{sql, args})
}

func (t *sqlRecorder) queries() []recorded {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]recorded(nil), t.seen...)
}

func (t *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.add(d.SQL, d.Args)
	return ctx
}

func (t *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *sqlRecorder) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.add(d.SQL, d.Args)
}

func (t *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func containsArg(args []any, v string) bool {
	for _, a := range args {
		if s, ok := a.(string); ok && s == v {
			return true
		}
	}
	return false
}

var placeholder = regexp.MustCompile(`\$(\d+)`)

// withLiterals replaces each $n of sql by its argument as an SQL literal, or by
// ids[argument] for the string arguments ids names.
func withLiterals(sql string, args []any, ids map[string]string) (string, error) {
	var bad error
	out := placeholder.ReplaceAllStringFunc(sql, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		if n < 1 || n > len(args) {
			bad = fmt.Errorf("bounds: %s without an argument", p)
			return p
		}
		lit, err := literal(args[n-1], ids)
		if err != nil {
			bad = err
		}
		return lit
	})
	return out, bad
}

func literal(v any, ids map[string]string) (string, error) {
	if v == nil {
		return "NULL", nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return "NULL", nil
		}
		return literal(rv.Elem().Interface(), ids)
	}
	switch x := v.(type) {
	case string:
		if e, ok := ids[x]; ok {
			return e, nil
		}
		return "'" + strings.ReplaceAll(x, "'", "''") + "'", nil
	case []byte:
		return `'\x` + hex.EncodeToString(x) + `'::bytea`, nil
	case bool:
		return strconv.FormatBool(x), nil
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(x), nil
	case time.Duration:
		return fmt.Sprintf("'%d microseconds'::interval", x.Microseconds()), nil
	case time.Time:
		return "'" + x.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'::timestamptz", nil
	}
	return "", fmt.Errorf("bounds: no SQL literal for an argument of type %T", v)
}

// oneLine joins a statement's lines: a pgbench script takes one statement a line.
func oneLine(sql string) string { return strings.Join(strings.Fields(sql), " ") }

var tpsLine = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

var rpsLine = regexp.MustCompile(`([0-9.]+) requests per second`)

func runPgbench(ctx context.Context, bin, url, script string, clients, secs int) (float64, error) {
	cmd := exec.CommandContext(ctx, bin, "-n", "-M", "prepared", "-f", script,
		"-c", strconv.Itoa(clients), "-j", "2", "-T", strconv.Itoa(secs), url)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	m := tpsLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench printed no tps\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// redisScriptBound runs the three-command script (SET NX EX, ZADD NX,
// HSET) with redis-benchmark, 32 clients, on keys under the session's prefix.
func (s *session) redisScriptBound(ctx context.Context, secs int) (float64, error) {
	bin, err := findRedisBenchmark()
	if err != nil {
		return 0, err
	}
	opt, err := redis.ParseURL(s.env.RedisURL)
	if err != nil {
		return 0, err
	}
	if opt.TLSConfig != nil {
		return 0, errors.New("bounds: redis-benchmark here does not speak TLS; give a plain redis:// URL")
	}
	host, port, ok := strings.Cut(opt.Addr, ":")
	if !ok {
		return 0, fmt.Errorf("bounds: Redis address %q", opt.Addr)
	}
	// About secs seconds of requests, at the rate the issue quotes.
	n := max(1000, secs*60_000)
	args := []string{"-h", host, "-p", port, "-n", strconv.Itoa(n), "-c", "32", "-r", "10000000", "-q",
		"--dbnum", strconv.Itoa(opt.DB)}
	if opt.Username != "" {
		args = append(args, "--user", opt.Username)
	}
	if opt.Password != "" {
		args = append(args, "-a", opt.Password, "--no-auth-warning")
	}
	p := s.prefix + ":bound:"
	args = append(args, "EVAL",
		"redis.call('SET', KEYS[1], '1', 'NX', 'EX', 3600); redis.call('ZADD', KEYS[2], 'NX', 1, KEYS[1]); redis.call('HSET', KEYS[3], 'p', ARGV[1]); return 1",
		"3", p+"k:__rand_int__", p+"z", p+"h:__rand_int__", string(payload20))
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w\n%s", err, out)
	}
	m := rpsLine.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("redis-benchmark printed no rate\n%s", lastLine(out))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\r")
	return lines[len(lines)-1]
}
