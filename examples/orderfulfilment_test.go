package examples

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/delayq/delayq/internal/testenv"
)

// TestOrderFulfilment runs the workflow example, which brings its own relay,
// once per outcome on servers of its own: every order ships exactly once when
// both steps succeed, and is refunded exactly once, with only what succeeded
// undone, when one of them dies.
func TestOrderFulfilment(t *testing.T) {
	t.Parallel()
	bin := build(t, "orderfulfilment")
	for _, tc := range []struct {
		fail string
		// report is the example's last line.
		report string
		// effects: rows of each business table, each query's count.
		effects map[string]int
		// tasks: the count of each queue's tasks in each state, "queue state".
		tasks map[string]int
	}{{
		fail:   "",
		report: "orders 3: shipped 3, refunded 0, shipped or refunded more than once 0",
		effects: map[string]int{
			"SELECT count(*) FROM reservations":                    3,
			"SELECT count(*) FROM charges":                         3,
			"SELECT count(DISTINCT order_id) FROM shipments":       3,
			"SELECT count(*) FROM shipments":                       3,
			"SELECT count(*) FROM refunds":                         0,
			"SELECT count(*) FROM orders WHERE status = 'shipped'": 3,
			"SELECT count(*) FROM shipments s JOIN charges c ON s.charge = 'ch_' || c.n AND c.order_id = s.order_id": 3,
		},
		tasks: map[string]int{"reserve done": 3, "charge done": 3, "ship done": 3, "refund cancelled": 3},
	}, {
		fail:   "charge",
		report: "orders 3: shipped 0, refunded 3, shipped or refunded more than once 0",
		effects: map[string]int{
			"SELECT count(*) FROM reservations":            3,
			"SELECT count(*) FROM charges":                 0,
			"SELECT count(*) FROM shipments":               0,
			"SELECT count(*) FROM refunds":                 3,
			"SELECT count(DISTINCT order_id) FROM refunds": 3,
			"SELECT count(*) FROM refunds WHERE charge_refunded IS NULL AND reservation_released LIKE 'res_%'": 3,
			"SELECT count(*) FROM orders WHERE status = 'refunded'":                                            3,
		},
		tasks: map[string]int{"reserve done": 3, "charge dead": 3, "ship dead": 3, "refund done": 3},
	}, {
		fail:   "reserve",
		report: "orders 3: shipped 0, refunded 3, shipped or refunded more than once 0",
		effects: map[string]int{
			"SELECT count(*) FROM reservations":            0,
			"SELECT count(*) FROM charges":                 3,
			"SELECT count(*) FROM shipments":               0,
			"SELECT count(*) FROM refunds":                 3,
			"SELECT count(DISTINCT order_id) FROM refunds": 3,
			"SELECT count(*) FROM refunds WHERE charge_refunded LIKE 'ch_%' AND reservation_released IS NULL": 3,
			"SELECT count(*) FROM orders WHERE status = 'refunded'":                                           3,
		},
		tasks: map[string]int{"reserve dead": 3, "charge done": 3, "ship dead": 3, "refund done": 3},
	}} {
		name := tc.fail
		if name == "" {
			name = "none"
		}
		t.Run("fail="+name, func(t *testing.T) {
			t.Parallel()
			s := servers{dbURL: testenv.PostgresURL(t), redisURL: testenv.OwnRedis(t).URL()}
			s.pool = testenv.Pool(t, s.dbURL)
			args := []string{"--orders", "3"}
			if tc.fail != "" {
				args = append(args, "--fail", tc.fail)
			}
			out, err := s.command(bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("orderfulfilment %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			t.Logf("orderfulfilment %s:\n%s", strings.Join(args, " "), out)
			if !strings.Contains(string(out), tc.report) {
				t.Fatalf("want the line %q in the output (above)", tc.report)
			}
			ctx := context.Background()
			for q, want := range tc.effects {
				var n int
				if err := s.pool.QueryRow(ctx, q).Scan(&n); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				if n != want {
					t.Errorf("%s = %d, want %d", q, n, want)
				}
			}
			got := map[string]int{}
			rows, err := s.pool.Query(ctx, `SELECT queue || ' ' || state, count(*) FROM delayq_outbox GROUP BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var k string
				var n int
				if err := rows.Scan(&k, &n); err != nil {
					t.Fatal(err)
				}
				got[k] = n
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.tasks) {
				t.Errorf("tasks by queue and state = %v, want %v", got, tc.tasks)
			}
			for k, want := range tc.tasks {
				if got[k] != want {
					t.Errorf("tasks %q = %d, want %d (all: %v)", k, got[k], want, got)
				}
			}
			if tc.fail != "" {
				// ship never ran: it died with its dependency's reason.
				var reasons int
				err := s.pool.QueryRow(ctx, `SELECT count(*) FROM delayq_outbox WHERE queue = 'ship' AND attempt = 0
					AND last_error LIKE 'dependency ' || $1 || '/order-% dead:%'`, tc.fail).Scan(&reasons)
				if err != nil {
					t.Fatal(err)
				}
				if reasons != 3 {
					t.Errorf("ship tasks dead with the reason of %s's death, never run: %d, want 3", tc.fail, reasons)
				}
			}
		})
	}
}

// TestREADMEWorkflowsBlock keeps the Go block of the README's "Workflows"
// section a piece of the example, which go vet and go build check: its lines,
// indented with four spaces instead of tabs, are lines of main.go as they are
// there (one tab deeper: the body of placeOrder).
func TestREADMEWorkflowsBlock(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Workflows\n")
	if !ok {
		t.Fatal(`README.md has no "## Workflows" section`)
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal(`README.md's "Workflows" section has no Go block`)
	}
	lines := strings.Split(strings.TrimSuffix(m[1], "\n"), "\n")
	for i, l := range lines {
		l = regexp.MustCompile(`^(    )+`).ReplaceAllStringFunc(l, func(s string) string {
			return strings.Repeat("\t", len(s)/4)
		})
		lines[i] = "\t" + l
	}
	src, err := os.ReadFile("orderfulfilment/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if block := strings.Join(lines, "\n") + "\n"; !strings.Contains(string(src), block) {
		t.Errorf("README.md's Workflows block is not a piece of examples/orderfulfilment/main.go:\n%s", block)
	}
}
