package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

// errHelp is returned when --help was asked for: usage printed, exit 0.
var errHelp = errors.New("help requested")

// flagSet is a subcommand's flags with its help text.
type flagSet struct {
	*flag.FlagSet
	help func()
}

// newFlagSet makes a flag set whose --help prints the synopsis, the examples and
// the flags with their defaults.
func newFlagSet(m *Main, name, synopsis, examples string) *flagSet {
	fs := flag.NewFlagSet("delayq "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by Run
	fs.Usage = func() {}     // the flag package calls it on every error; help is printed by parse
	help := func() {
		out := m.Stdout
		fmt.Fprintf(out, "Usage: delayq %s\n\n", synopsis)
		if examples != "" {
			fmt.Fprintf(out, "Examples:\n%s\n", examples)
		}
		fmt.Fprintln(out, "Flags:")
		fs.SetOutput(out)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		fmt.Fprintln(out)
		if env := envOf(fs); env != "" {
			fmt.Fprintln(out, env)
		}
		fmt.Fprintln(out, "Exit codes: 0 ok, 1 failure, 2 usage error.")
	}
	return &flagSet{FlagSet: fs, help: help}
}

// envOf is the help's line on the environment a command reads: the variables
// of the URL flags it has (none for dev, version).
func envOf(fs *flag.FlagSet) string {
	var vars []string
	for _, f := range [][2]string{{"database-url", "DATABASE_URL"}, {"redis-url", "REDIS_URL"}} {
		if fs.Lookup(f[0]) != nil {
			vars = append(vars, f[1])
		}
	}
	switch len(vars) {
	case 0:
		return ""
	case 1:
		return "Environment: " + vars[0] + " (its flag overrides it)."
	}
	return "Environment: " + strings.Join(vars, ", ") + " (flags override them)."
}

// parse parses args, turning flag errors into usage errors and --help into errHelp.
func parse(fs *flagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.help()
			return errHelp
		}
		return usagef("%s (see --help)", flagError(fs.FlagSet, err.Error()))
	}
	return nil
}

// flagErrors put the flag package's messages in the words of our help: flags
// with two dashes, "unknown flag".
var flagErrors = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`^flag provided but not defined: -+(.*)$`), "unknown flag --$1"},
	{regexp.MustCompile(`^flag needs an argument: -+(.*)$`), "flag --$1 needs a value"},
	{regexp.MustCompile(`^invalid boolean value (".*") for -+([^:]*): .*$`), "--$2 $1: want true or false"},
	{regexp.MustCompile(`^invalid value (".*") for flag -+([^:]*): (.*)$`), "--$2 $1: $3"},
}

// flagError rewords msg, an error of fs.Parse; the bare "parse error" of a
// number or a duration says what was wanted.
func flagError(fs *flag.FlagSet, msg string) string {
	for _, e := range flagErrors {
		if !e.re.MatchString(msg) {
			continue
		}
		msg = e.re.ReplaceAllString(msg, e.with)
		name, _, _ := strings.Cut(strings.TrimPrefix(msg, "--"), " ")
		if f := fs.Lookup(name); f != nil && strings.HasSuffix(msg, ": parse error") {
			if g, ok := f.Value.(flag.Getter); ok {
				msg = strings.TrimSuffix(msg, "parse error") + wanted(g.Get())
			}
		}
		return msg
	}
	return msg
}

func wanted(v any) string {
	switch v.(type) {
	case time.Duration:
		return "want a duration such as 90s, 5m or 1h30m"
	case int, int64, uint, uint64:
		return "want a whole number"
	case float64:
		return "want a number"
	}
	return "parse error"
}

// parseArgs parses flags and positional arguments in any order and checks that
// there are exactly want positional ones (-1: any number).
func parseArgs(fs *flagSet, args []string, want int) error {
	var pos []string
	for i, a := range args {
		if a == "--" { // everything after is positional, as usual
			pos = append(pos, args[i+1:]...)
			args = args[:i]
			break
		}
	}
	var lead []string
	for {
		if err := parse(fs, args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		lead = append(lead, fs.Arg(0))
		args = fs.Args()[1:]
	}
	pos = append(lead, pos...)
	if want >= 0 && len(pos) != want {
		if len(pos) > want {
			return usagef("unexpected argument %q (see --help)", pos[want])
		}
		return usagef("missing argument (see --help)")
	}
	// Keep the positional arguments where Args finds them.
	_ = fs.FlagSet.Parse(append([]string{"--"}, pos...))
	return nil
}

// queueList is a --queue flag that may repeat and take comma-separated names.
type queueList struct{ list []string }

func (q *queueList) String() string { return strings.Join(q.list, ",") }

func (q *queueList) Set(s string) error {
	for _, name := range strings.Split(s, ",") {
		if err := validate.Queue(name); err != nil {
			return err
		}
		q.list = append(q.list, name)
	}
	return nil
}

var _ flag.Value = (*queueList)(nil)

func isSet(fs *flagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
