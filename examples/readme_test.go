package examples

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEFirstBlock keeps the README's first Go block, the whole flow on one
// screen, a program that compiles: it must be examples/quickstart/main.go
// (which go vet and go build check with every example), indented with four
// spaces instead of tabs.
func TestREADMEFirstBlock(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no Go block")
	}
	want, err := os.ReadFile("quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	got := regexp.MustCompile(`(?m)^(    )+`).ReplaceAllStringFunc(string(m[1]), func(s string) string {
		return strings.Repeat("\t", len(s)/4)
	})
	if got != string(want) {
		t.Errorf("README.md's first Go block differs from examples/quickstart/main.go:\n%s", diffLines(got, string(want)))
	}
}

// diffLines names the first line where a and b differ.
func diffLines(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  README:     %s\n  quickstart: %s", i+1, x, y)
		}
	}
	return "(same lines)"
}
