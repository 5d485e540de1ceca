package taskstate

import (
	"os"
	"strings"
	"testing"
)

// docs/DESIGN.md shows the transition table as Transitions says it: a change of the
// state machine changes the living design with it.
func TestTransitionsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := Table(); !strings.Contains(string(doc), want) {
		t.Errorf("docs/DESIGN.md lacks the transition table; paste it:\n%s", want)
	}
}

// Every transition names statements that exist and states that parse, and every
// state is reached by one.
func TestTransitionsWellFormed(t *testing.T) {
	reached := map[State]bool{}
	for _, tr := range Transitions {
		for _, f := range tr.From {
			if _, err := Parse(string(f)); err != nil {
				t.Errorf("%s: from %v", tr.Name, err)
			}
		}
		if tr.To != "" && tr.To != Kept {
			if _, err := Parse(string(tr.To)); err != nil {
				t.Errorf("%s: to %v", tr.Name, err)
			}
			reached[tr.To] = true
		}
		if tr.Postgres == "" || tr.Order == "" || tr.By == "" {
			t.Errorf("%s: incomplete %+v", tr.Name, tr)
		}
	}
	for _, s := range States {
		if !reached[s] {
			t.Errorf("no transition reaches %s", s)
		}
	}
}
