package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildVersion and buildCommit are what to report when the build info has no
// module version or no commit: set with -ldflags "-X main.buildVersion=v1.2.3
// -X main.buildCommit=<sha>" where the source is not a git checkout at build time
// (the Dockerfile's build, whose context leaves out .git; a build with
// -buildvcs=false). The build info wins when it has them (go install
// github.com/delayq/delayq/cmd/delayq@v1.2.3, a build in a checkout).
var buildVersion, buildCommit string

// versionInfo is what `delayq version` prints.
type versionInfo struct {
	Version  string // module version: a tag, a pseudo-version, or "(devel)"
	Commit   string // VCS revision, "unknown" if the build recorded none
	Time     string // commit time (RFC 3339), empty if unknown
	Modified bool   // the work tree had uncommitted changes
	Go       string // Go version the binary was built with
	Platform string // GOOS/GOARCH
}

// readVersion reads the running binary's build info.
func readVersion() versionInfo {
	bi, _ := debug.ReadBuildInfo()
	return versionFromBuildInfo(bi, buildVersion, buildCommit)
}

// versionFromBuildInfo extracts the version, the commit and the Go version; bi
// may be nil (a binary built without module support). fallbackVersion and
// fallbackCommit stand in for what the build info lacks.
func versionFromBuildInfo(bi *debug.BuildInfo, fallbackVersion, fallbackCommit string) versionInfo {
	v := versionInfo{Version: "(devel)", Commit: "unknown", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if fallbackVersion != "" {
		v.Version = fallbackVersion
	}
	if fallbackCommit != "" {
		v.Commit = fallbackCommit
	}
	if bi == nil {
		return v
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the version report: three lines.
func (v versionInfo) String() string {
	commit := v.Commit
	switch {
	case v.Time != "" && v.Modified:
		commit += " (" + v.Time + ", modified)"
	case v.Time != "":
		commit += " (" + v.Time + ")"
	case v.Modified:
		commit += " (modified)"
	}
	return fmt.Sprintf("delayq %s\ncommit: %s\ngo: %s %s\n", v.Version, commit, v.Go, v.Platform)
}

func runVersion(_ context.Context, m *Main, args []string) error {
	fs := newFlagSet(m, "version", "version",
		"  delayq version      # module version, commit, Go version\n"+
			"  delayq --version    # the same\n")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	fmt.Fprint(m.Stdout, readVersion().String())
	return nil
}
