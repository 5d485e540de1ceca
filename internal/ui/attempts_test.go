package ui

import (
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/taskstate"
	"github.com/delayq/delayq/outbox"
)

// The task page shows the attempt history: each failed run with its outcome and
// error, a panic's stack (escaped) behind a disclosure, and the success of a
// done task; a task that never ran says so.
func TestTaskPageShowsAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "h", Payload: []byte(`{}`), Delay: time.Hour},
		outbox.Task{Queue: "mail", ID: "fresh", Payload: []byte(`{}`), Delay: time.Hour})
	k := taskstate.Key{Queue: "mail", ID: "h", Version: 1}
	for _, f := range []taskstate.Failure{
		{Key: k, Attempt: 1, Err: "smtp: 421 try later", Delay: time.Millisecond},
		{Key: k, Attempt: 2, Err: "panic: nil map", Stack: "goroutine 9 [running]:\nmail.send(<script>alert(6)</script>)", Delay: time.Millisecond},
	} {
		if ok, err := e.store.RecordFailure(ctxT(t), e.pool, f); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if _, err := e.pool.Exec(ctxT(t), e.store.SQL.Guard, "mail", "h", 1, false); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	_, body := c.get("/task?queue=mail&id=h")
	i := strings.Index(body, `<section id="attempts">`)
	if i < 0 {
		t.Fatalf("no attempts section:\n%s", body)
	}
	sec := body[i:]
	sec = sec[:strings.Index(sec, "</section>")]
	if n := strings.Count(sec, `<tr class="attempt">`); n != 3 {
		t.Errorf("%d attempts shown, want 3:\n%s", n, sec)
	}
	last := 0
	for _, want := range []string{`class="outcome retried">retried<`, "smtp: 421 try later",
		`class="outcome retried">retried<`, "panic: nil map", `<details class="stack">`,
		"mail.send(&lt;script&gt;alert(6)&lt;/script&gt;)", `class="outcome succeeded">succeeded<`} {
		j := strings.Index(sec[last:], want)
		if j < 0 {
			t.Fatalf("attempts section lacks %q after byte %d (in run order):\n%s", want, last, sec)
		}
		last += j + len(want)
	}
	if strings.Contains(strings.ToLower(sec), "<script") {
		t.Errorf("unescaped stack:\n%s", sec)
	}
	_, body = c.get("/task?queue=mail&id=fresh")
	if !strings.Contains(body, "No run recorded yet.") {
		t.Errorf("a task that never ran:\n%s", body)
	}
}
