package ui

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/delayq/delayq/outbox"
)

// The tasks list sorts by due, created or finished time as well as by id: the
// order of ord-1 … ord-12 enqueued one after the other is theirs, not the text's.
func TestTasksSorted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *Config) { c.PageSize = 50 })
	for i := 1; i <= 12; i++ { // one at a time: each its own creation time
		e.enqueue(t, outbox.Task{Queue: "orders", ID: fmt.Sprintf("ord-%d", i), Payload: []byte(`{}`), Delay: time.Duration(13-i) * time.Hour})
	}
	c := e.client(t)
	idRE := regexp.MustCompile(`<tr data-id="([^"]+)">`)
	ids := func(path string) []string {
		resp, body := c.get(path)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s\n%s", path, resp.Status, body)
		}
		var out []string
		for _, m := range idRE.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	created := []string{"ord-12", "ord-11", "ord-10", "ord-9", "ord-8", "ord-7", "ord-6", "ord-5", "ord-4", "ord-3", "ord-2", "ord-1"}
	if got := ids("/tasks?queue=orders&sort=created"); !slices.Equal(got, created) {
		t.Errorf("by created:\n got %q\nwant %q", got, created)
	}
	if got := ids("/tasks?queue=orders&sort=due"); !slices.Equal(got, created) { // due 12 h … 1 h from now
		t.Errorf("by due:\n got %q\nwant %q", got, created)
	}
	if got := ids("/tasks?queue=orders&sort=id"); got[1] != "ord-10" {
		t.Errorf("by id: %q", got)
	}
	_, body := c.get("/tasks?queue=orders&sort=created")
	if !strings.Contains(body, `<option value="created" selected>`) || !strings.Contains(body, `id="limits"`) || !strings.Contains(body, "at most 10,000 rows") || !strings.Contains(body, "stopped after 120 ms") || !strings.Contains(body, "<th>created</th>") {
		t.Errorf("the sorted page does not say its order and limits:\n%s", body)
	}
	if _, body := c.get("/tasks?state=done&sort=created"); !strings.Contains(body, "choose a queue") {
		t.Errorf("a sort that reads a queue without one:\n%s", body)
	}
}

// A search by payload finds the tasks whose JSON has the value at the path
// (exactly: not a payload that merely holds the text), says what it read, and
// is refused where payloads are hidden.
func TestSearchByPayload(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t,
		outbox.Task{Queue: "orders", ID: "a", Payload: []byte(`{"customer":{"id":42,"email":"ann@example.com"},"items":[{"sku":"X-1"}]}`), Delay: time.Hour},
		outbox.Task{Queue: "orders", ID: "b", Payload: []byte(`{"customer":{"id":7},"note":"42"}`), Delay: time.Hour},
		outbox.Task{Queue: "orders", ID: "c", Payload: []byte(`{"customer":{"id":42.0}}`), Delay: time.Hour},
		outbox.Task{Queue: "orders", ID: "d", Payload: []byte("not json 42"), Delay: time.Hour},
		outbox.Task{Queue: "other", ID: "e", Payload: []byte(`{"customer":{"id":42}}`), Delay: time.Hour},
	)
	c := e.client(t)
	idRE := regexp.MustCompile(`<tr data-id="([^"]+)">`)
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"path=customer.id&value=42", []string{"a", "c"}}, // 42.0 is the number 42
		{"path=%24.customer.id&value=42", []string{"a", "c"}},
		{"path=customer.email&value=ann%40example.com", []string{"a"}},
		{"path=items%5B0%5D.sku&value=X-1", []string{"a"}},
		{"path=note&value=%2242%22", []string{"b"}},
		{"path=customer.id&value=7", []string{"b"}},
		{"path=customer.id&value=9", nil},
	} {
		resp, body := c.get("/tasks?queue=orders&" + tc.query)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", tc.query, resp.Status)
		}
		var got []string
		for _, m := range idRE.FindAllStringSubmatch(body, -1) {
			got = append(got, m[1])
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: found %q, want %q", tc.query, got, tc.want)
		}
		if !strings.Contains(body, `id="search-note"`) || !strings.Contains(body, "Searched 4 rows of orders") || !strings.Contains(body, "last row") {
			t.Errorf("%s: the page does not say what it read:\n%s", tc.query, body)
		}
	}
	if _, body := c.get("/tasks?path=customer.id&value=42"); !strings.Contains(body, "choose a queue") {
		t.Error("a search without a queue")
	}
	hidden := newEnv(t, func(c *Config) { c.HidePayloads = true })
	hidden.enqueue(t, outbox.Task{Queue: "orders", ID: "a", Payload: []byte(`{"pin":1234}`), Delay: time.Hour})
	if _, body := hidden.client(t).get("/tasks?queue=orders&path=pin&value=1234"); !strings.Contains(body, "payloads are hidden") || strings.Contains(body, `data-id="a"`) {
		t.Errorf("a search where payloads are hidden:\n%s", body)
	}
}

// A statement that outlives the time limit is cancelled and reported as such.
func TestBoundedQueriesStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	start := time.Now()
	err := e.h.bounded(ctxT(t), func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), "SELECT pg_sleep(5)")
		return err
	})
	if !errors.Is(err, errTooLong) || time.Since(start) > 4*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
}

// The search's and the sort's words come back on the page escaped, and a sort
// the list does not know is refused in words, not run.
func TestSearchEscaped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "orders", ID: "a", Payload: []byte(`{"x":"<script>alert(1)</script>"}`), Delay: time.Hour})
	c := e.client(t)
	_, body := c.get("/tasks?queue=orders&path=%22%3E%3Cb%3Ex&value=%3Cscript%3Ealert(1)%3C%2Fscript%3E")
	if strings.Contains(body, "<script>") || strings.Contains(body, `"><b>`) {
		t.Errorf("unescaped:\n%s", body)
	}
	_, body = c.get("/tasks?queue=orders&path=x&value=%3Cscript%3Ealert(1)%3C%2Fscript%3E")
	if !strings.Contains(body, `<tr data-id="a">`) || strings.Contains(body, "<script>") {
		t.Errorf("the search for markup:\n%s", body)
	}
	_, body = c.get("/tasks?queue=orders&sort=%3Cb%3Esize")
	if !strings.Contains(body, "id, due, created or finished") || strings.Contains(body, "<b>size") {
		t.Errorf("an unknown sort:\n%s", body)
	}
}
