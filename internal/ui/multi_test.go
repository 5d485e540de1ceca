package ui

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delayq/delayq/internal/dispatch"
	"github.com/delayq/delayq/internal/reconcile"
	"github.com/delayq/delayq/internal/testenv"
	"github.com/delayq/delayq/internal/validate"
	"github.com/delayq/delayq/outbox"
)

// NewMulti refuses bad databases in one line wrapping ErrInvalidConfig; a key
// is checked as delayq.Config.Database's.
func TestNewMultiRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	db := func(key string) Database { return Database{Key: key, DB: e.pool, Redis: e.dq, Outbox: e.ob} }
	many := make([]Database, MaxDatabases+1)
	for i := range many {
		many[i] = db("d" + strings.Repeat("x", i%30) + string(rune('a'+i%26)))
	}
	for _, c := range []struct {
		name string
		dbs  []Database
		cfg  Config
		want string
	}{
		{"none", nil, Config{ReadOnly: true}, "no database"},
		{"empty key", []Database{db("eu1"), db("")}, Config{ReadOnly: true}, "database 2: key"},
		{"upper case", []Database{db("EU1")}, Config{ReadOnly: true}, "database 1: key"},
		{"markup", []Database{db(`<b>"x"</b>`)}, Config{ReadOnly: true}, "database 1: key"},
		{"a slash", []Database{db("eu/1")}, Config{ReadOnly: true}, "database 1: key"},
		{"twice", []Database{db("eu1"), db("us1"), db("eu1")}, Config{ReadOnly: true}, `key "eu1" given twice`},
		{"too many", many, Config{ReadOnly: true}, "at most 64"},
		{"stores in Config", []Database{db("eu1")}, Config{ReadOnly: true, DB: e.pool}, "each database's"},
		{"no credentials", []Database{db("eu1")}, Config{}, "need a Token"},
		{"no stores", []Database{{Key: "eu1"}}, Config{ReadOnly: true}, "database eu1: ui: invalid config: DB, Redis and Outbox are required"},
	} {
		m, err := NewMulti(c.dbs, c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || m != nil {
			t.Errorf("%s: %v, want ErrInvalidConfig and %q in one line", c.name, err, c.want)
		}
		if c.name == "upper case" && !errors.Is(err, validate.ErrInvalidDatabase) {
			t.Errorf("%s: %v is not validate.Database's", c.name, err)
		}
	}
}

// The overview escapes what it shows: a key or a queue name with markup (which
// validation refuses before it gets there) is text on the page.
func TestOverviewEscapes(t *testing.T) {
	t.Parallel()
	h, err := newBase(Config{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	st, all := reconcile.TotalStats(nil)
	data := overviewData{Databases: []overviewDB{
		{Key: `<b id="k">eu1</b>`, Queues: []overviewQueue{{}}},
		{Key: `"><script>x</script>`, Err: `<i>down</i>`},
	}, Total: st, All: all}
	data.Databases[0].Queues[0].Queue = `<em>q</em>`
	w := newRecorder()
	p := h.newPage(mustReq("/"), "")
	p.Overview = true
	h.render(w, p, "overview", data)
	body := w.Body.String()
	for _, raw := range []string{`<b id="k">`, `<script>`, `<i>down`, `<em>q`} {
		if strings.Contains(body, raw) {
			t.Errorf("the overview shows %s unescaped", raw)
		}
	}
	for _, esc := range []string{`&lt;b id=&#34;k&#34;&gt;eu1&lt;/b&gt;`, `&lt;i&gt;down&lt;/i&gt;`, `&lt;em&gt;q&lt;/em&gt;`} {
		if !strings.Contains(body, esc) {
			t.Errorf("the overview lacks %s", esc)
		}
	}
}

// A database whose figures cannot be read shows its error: the others are
// shown, and the total is theirs, saying which is left out.
func TestOverviewWithADatabaseDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.enqueue(t, outbox.Task{Queue: "mail", ID: "m1", Payload: []byte(`{}`), Delay: time.Hour})
	rdb, prefix := testenv.Redis(t)
	downDQ, err := dispatch.New(rdb, dispatch.Config{Prefix: prefix + ":down"})
	if err != nil {
		t.Fatal(err)
	}
	nowhere, err := outbox.New(outbox.Config{Schema: "not_migrated"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMulti([]Database{
		{Key: "up", DB: e.pool, Redis: e.dq, Outbox: e.ob},
		{Key: "down", DB: e.pool, Redis: downDQ, Outbox: nowhere},
	}, Config{Token: testToken, Refresh: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := newRecorder()
	m.ServeHTTP(w, mustReq("/"))
	body := w.Body.String()
	if w.Code != http.StatusOK {
		t.Fatalf("%d\n%s", w.Code, body)
	}
	for _, want := range []string{`<tr data-db="up" data-queue="mail">`, `<tr data-db="down" data-error>`,
		`Not in the total, their figures unread: down.`, `data-total data-queue="mail"`, `<meta http-equiv="refresh" content="5">`,
		`href="/login"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview lacks %s\n%s", want, body)
		}
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
}
