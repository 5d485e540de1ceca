package main

import (
	"testing"
	"time"

	"github.com/delayq/delayq/internal/validate"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]validate.RateLimit{
		"100/s":   {Limit: 100, Period: time.Second},
		"100/1s":  {Limit: 100, Period: time.Second},
		"6000/1m": {Limit: 6000, Period: time.Minute},
		"5/250ms": {Limit: 5, Period: 250 * time.Millisecond},
		"1/h":     {Limit: 1, Period: time.Hour},
		"none":    {Period: time.Second},
		"0":       {Period: time.Second},
	} {
		if got, err := parseRate(in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "10", "/s", "0/s", "-1/s", "10/", "10/0s", "10/1us", "10/1.5ms", "x/s", "10/fortnight", "10000000000/s"} {
		if _, err := parseRate(bad); err == nil {
			t.Errorf("parseRate(%q) accepted", bad)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"100/s", "6000/1m", "none", "5/250ms", "1/-1s", "9/1e3h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRate(s)
		if err != nil {
			return
		}
		if err := r.WithDefaults().Validate(); err != nil {
			t.Fatalf("parseRate(%q) = %+v, which does not validate: %v", s, r, err)
		}
	})
}
