package main

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionCommand: `delayq version` and `delayq --version` print the same
// three lines: the module version, the commit and the Go version of this binary.
func TestVersionCommand(t *testing.T) {
	t.Parallel()
	r := cliRun(t, nil, "version")
	r.want(t, exitOK, "delayq ", "\ncommit: ", "\ngo: "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+"\n")
	if n := strings.Count(r.stdout, "\n"); n != 3 {
		t.Errorf("version prints %d lines, want 3:\n%s", n, r.stdout)
	}
	for _, flag := range []string{"--version", "-version"} {
		if f := cliRun(t, nil, flag); f.code != exitOK || f.stdout != r.stdout {
			t.Errorf("delayq %s: exit %d, output %q; want exit 0 and `delayq version`'s %q", flag, f.code, f.stdout, r.stdout)
		}
	}
	cliRun(t, nil, "version", "extra").want(t, exitUsage)
	cliRun(t, nil, "version", "--help").want(t, exitOK, "Usage: delayq version")
}

// TestVersionFromBuildInfo: what the build info says wins; a version and commit
// set with -ldflags -X are the fallback; nothing at all gives "(devel)" and
// "unknown".
func TestVersionFromBuildInfo(t *testing.T) {
	t.Parallel()
	vcs := func(rev, tm, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "-trimpath", Value: "true"}, {Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: tm}, {Key: "vcs.modified", Value: modified}}
	}
	goLine := "go: go1.99.1 " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	cases := []struct {
		name    string
		bi      *debug.BuildInfo
		version string // -X main.buildVersion
		commit  string // -X main.buildCommit
		want    string
	}{
		{"no build info", nil, "", "", "delayq (devel)\ncommit: unknown\ngo: " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"},
		{"go install of a tag", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Path: "github.com/delayq/delayq", Version: "v0.3.1"}},
			"v9.9.9", "", "delayq v0.3.1\ncommit: unknown\n" + goLine},
		{"checkout, clean", &debug.BuildInfo{GoVersion: "go1.99.1",
			Main: debug.Module{Version: "v0.0.0-20261201101500-0123456789ab"}, Settings: vcs("0123456789abcdef", "2026-12-01T10:15:00Z", "false")},
			"", "", "delayq v0.0.0-20261201101500-0123456789ab\ncommit: 0123456789abcdef (2026-12-01T10:15:00Z)\n" + goLine},
		{"checkout, modified, ldflags commit ignored", &debug.BuildInfo{GoVersion: "go1.99.1",
			Main: debug.Module{Version: "(devel)"}, Settings: vcs("0123456789abcdef", "2026-12-01T10:15:00Z", "true")},
			"", "feedface", "delayq (devel)\ncommit: 0123456789abcdef (2026-12-01T10:15:00Z, modified)\n" + goLine},
		{"container build: version and commit from -ldflags", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}},
			"v1.2.3", "feedface", "delayq v1.2.3\ncommit: feedface\n" + goLine},
	}
	for _, tc := range cases {
		if got := versionFromBuildInfo(tc.bi, tc.version, tc.commit).String(); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
