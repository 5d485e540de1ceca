package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// dockerfile is the repository's Dockerfile, read as a builder would: comments
// dropped, continuation lines joined, one instruction per entry.
type dockerfile struct {
	instructions []dockerInstruction
	args         map[string]string // ARG defaults, last one wins
}

type dockerInstruction struct {
	cmd  string // upper case: FROM, RUN, ...
	rest string
}

func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := dockerfile{args: map[string]string{}}
	var cur strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, rest, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		cur.Reset()
		in := dockerInstruction{cmd: strings.ToUpper(cmd), rest: strings.TrimSpace(rest)}
		df.instructions = append(df.instructions, in)
		if in.cmd == "ARG" {
			name, val, _ := strings.Cut(in.rest, "=")
			df.args[name] = val
		}
	}
	return df
}

// finalStage returns the instructions of the last stage (the default target).
func (df dockerfile) finalStage() []dockerInstruction {
	last := 0
	for i, in := range df.instructions {
		if in.cmd == "FROM" {
			last = i
		}
	}
	return df.instructions[last:]
}

// buildCommand finds the RUN instruction that builds pkg.
func (df dockerfile) buildCommand(t *testing.T, pkg string) string {
	t.Helper()
	for _, in := range df.instructions {
		if in.cmd == "RUN" && strings.Contains(in.rest, "go build") && strings.HasSuffix(in.rest, " "+pkg) {
			return in.rest
		}
	}
	t.Fatalf("Dockerfile: no RUN instruction with `go build ... %s`", pkg)
	return ""
}

var dockerVar = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// shellWords splits a shell command the way sh would for the simple commands a
// Dockerfile's RUN holds: words separated by blanks, single and double quotes,
// $VAR and ${VAR} expanded from vars (in double quotes and bare words).
func shellWords(t *testing.T, s string, vars map[string]string) []string {
	t.Helper()
	expand := func(w string) string {
		return dockerVar.ReplaceAllStringFunc(w, func(m string) string {
			name := dockerVar.FindStringSubmatch(m)[1]
			v, ok := vars[name]
			if !ok {
				t.Fatalf("Dockerfile build command uses $%s, which is no ARG", name)
			}
			return v
		})
	}
	var words []string
	var cur strings.Builder
	has := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			if has {
				words = append(words, cur.String())
				cur.Reset()
				has = false
			}
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				t.Fatalf("unterminated ' in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
			has = true
		case c == '"':
			end := strings.IndexByte(s[i+1:], '"')
			if end < 0 {
				t.Fatalf("unterminated \" in %q", s)
			}
			cur.WriteString(expand(s[i+1 : i+1+end]))
			i += end + 1
			has = true
		case strings.ContainsRune("|&;<>()`\\", rune(c)):
			t.Fatalf("Dockerfile build command %q uses %q: keep it one simple command this test can run", s, c)
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t'\"", rune(s[j])) {
				j++
			}
			cur.WriteString(expand(s[i:j]))
			i = j - 1
			has = true
		}
	}
	if has {
		words = append(words, cur.String())
	}
	return words
}

// TestDockerfileBuild runs the Dockerfile's own build command for cmd/delayq
// outside a container (as the image's build stage would, on this machine's
// platform) and checks the binary is static: no program interpreter, no dynamic
// section, no shared library. The binary then reports the version and commit
// passed as build arguments, and its healthcheck command exists.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the release binary")
	}
	t.Parallel()
	df := readDockerfile(t)
	vars := map[string]string{}
	for k, v := range df.args {
		vars[k] = v
	}
	vars["TARGETOS"], vars["TARGETARCH"] = runtime.GOOS, runtime.GOARCH
	vars["VERSION"], vars["COMMIT"] = "v0.0.0-releasetest", "c0ffee0releasetest"

	words := shellWords(t, df.buildCommand(t, "./cmd/delayq"), vars)
	env := map[string]string{}
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		k, v, _ := strings.Cut(words[0], "=")
		env[k] = v
		words = words[1:]
	}
	if env["CGO_ENABLED"] != "0" {
		t.Errorf("the Dockerfile builds cmd/delayq with CGO_ENABLED=%q, want 0 (a static binary)", env["CGO_ENABLED"])
	}
	if len(words) < 3 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("Dockerfile build command is not `go build ...`: %q", words)
	}
	o := slices.Index(words, "-o")
	if o < 0 || o+1 >= len(words) {
		t.Fatalf("Dockerfile build command has no -o: %q", words)
	}
	bin := filepath.Join(t.TempDir(), "delayq")
	words[o+1] = bin

	cmd := exec.Command("go", words[1:]...)
	cmd.Dir = "../.." // the image's WORKDIR holds the module root
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// As in the image: .dockerignore leaves .git out of the context, so the build
	// info has no commit and the build arguments are what `version` reports.
	cmd.Env = append(cmd.Env, "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v (in the repository root): %v\n%s", words, err, out)
	}

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s has a %v program header: not a static binary", bin, p.Type)
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		t.Errorf("%s has a .dynamic section: not a static binary", bin)
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s imports shared libraries %v (%v)", bin, libs, err)
	}

	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("%s version: %v", bin, err)
	}
	if want := "delayq v0.0.0-releasetest\ncommit: c0ffee0releasetest\ngo: " + runtime.Version(); !strings.HasPrefix(string(out), want) {
		t.Errorf("delayq version of the Dockerfile's build:\n%s\nwant it to start with\n%s", out, want)
	}
	if out, err := exec.Command(bin, "healthcheck", "--help").CombinedOutput(); err != nil {
		t.Errorf("%s healthcheck --help: %v\n%s", bin, err, out)
	}
}

// TestDockerfileImage checks what the final stage promises: a distroless or
// scratch base (no shell), a non-root numeric user, the binary as entry point,
// the relay listening on the exposed port, and a HEALTHCHECK that runs the
// binary's own healthcheck against that port's /healthz, in exec form (no shell
// to run the shell form). .dockerignore leaves .git out.
func TestDockerfileImage(t *testing.T) {
	t.Parallel()
	stage := readDockerfile(t).finalStage()
	get := func(cmd string) string {
		v := ""
		for _, in := range stage {
			if in.cmd == cmd {
				v = in.rest
			}
		}
		if v == "" {
			t.Errorf("Dockerfile's final stage has no %s", cmd)
		}
		return v
	}
	if from := get("FROM"); !strings.HasPrefix(from, "gcr.io/distroless/static") && from != "scratch" {
		t.Errorf("final stage FROM %s: want a distroless static base or scratch (no shell)", from)
	}
	user := get("USER")
	if uid, _, _ := strings.Cut(user, ":"); uid == "0" || uid == "root" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("USER %s: want a numeric non-root user", user)
	}
	if ep := get("ENTRYPOINT"); ep != `["/delayq"]` {
		t.Errorf(`ENTRYPOINT %s, want ["/delayq"]`, ep)
	}
	expose := get("EXPOSE")
	cmdLine := get("CMD")
	listen := regexp.MustCompile(`"--listen",\s*"([^"]*)"`).FindStringSubmatch(cmdLine)
	if !strings.Contains(cmdLine, `"relay"`) || listen == nil {
		t.Fatalf("CMD %s: want the relay with --listen", cmdLine)
	}
	host, port, err := net.SplitHostPort(listen[1])
	if err != nil || (host != "" && host != "0.0.0.0") || port != expose {
		t.Errorf("CMD relay --listen %q: want every interface on the exposed port %s", listen[1], expose)
	}
	hc := get("HEALTHCHECK")
	m := regexp.MustCompile(`CMD \["/delayq", "healthcheck"(.*)\]$`).FindStringSubmatch(hc)
	if m == nil {
		t.Fatalf("HEALTHCHECK %s: want CMD [\"/delayq\", \"healthcheck\", ...] (exec form: there is no shell)", hc)
	}
	if !strings.Contains(m[1], `"--addr", "127.0.0.1:`+port+`"`) && !strings.Contains(m[1], `"--addr", ":`+port+`"`) {
		t.Errorf("HEALTHCHECK %s: does not check the relay's port %s", hc, port)
	}
	if strings.Contains(m[1], "--path") {
		t.Errorf("HEALTHCHECK %s: want the default path, /healthz (liveness, not readiness)", hc)
	}
	if imgs := baseImages(readDockerfile(t)); len(imgs) != 2 || !strings.HasPrefix(imgs[0], "golang:1.") {
		t.Errorf("base images %q: want the Go builder and the runtime base", imgs)
	}
	ignore, err := os.ReadFile("../../.dockerignore")
	if err != nil || !slices.Contains(strings.Fields(string(ignore)), ".git") {
		t.Errorf(".dockerignore does not leave out .git (%v)", err)
	}
}

// containerBuilder returns a docker-compatible command whose daemon answers, or
// "" when there is none.
func containerBuilder() string {
	for _, name := range []string{"docker", "podman"} {
		if _, err := exec.LookPath(name); err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := exec.CommandContext(ctx, name, "info").Run()
		cancel()
		if err == nil {
			return name
		}
	}
	return ""
}

// TestDockerImageVersion builds the image where a container builder runs and
// runs `delayq version` in it. Elsewhere TestDockerfileBuild stands in for it.
func TestDockerImageVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a container image")
	}
	t.Parallel()
	builder := containerBuilder()
	if builder == "" {
		t.Skip("no container builder answers here (docker info, podman info); TestDockerfileBuild checks the binary instead")
	}
	// A build that must pull its base images fails on a machine without access to
	// their registries: run only when they are here, or when asked to.
	if os.Getenv("DELAYQ_TEST_IMAGE") == "" {
		for _, img := range baseImages(readDockerfile(t)) {
			if err := exec.Command(builder, "image", "inspect", img).Run(); err != nil {
				t.Skipf("base image %s is not present (%s pull it, or set DELAYQ_TEST_IMAGE=1 to let the build pull it)", img, builder)
			}
		}
	}
	tag := fmt.Sprintf("delayq-releasetest:%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, builder, "build", "--build-arg", "COMMIT=c0ffee0image", "-t", tag, "../..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s build: %v\n%s", builder, err, lastLines(out, 40))
	}
	t.Cleanup(func() { _ = exec.Command(builder, "rmi", "-f", tag).Run() })
	out, err := exec.CommandContext(ctx, builder, "run", "--rm", tag, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s run %s version: %v\n%s", builder, tag, err, out)
	}
	if !strings.HasPrefix(string(out), "delayq ") || !strings.Contains(string(out), "commit: c0ffee0image") {
		t.Errorf("delayq version in the image:\n%s", out)
	}
	// No shell in the image.
	if err := exec.CommandContext(ctx, builder, "run", "--rm", "--entrypoint", "/bin/sh", tag, "-c", "true").Run(); err == nil {
		t.Errorf("the image has /bin/sh")
	}
}

// baseImages lists the images the Dockerfile's stages start FROM (not other
// stages), with ARG defaults substituted.
func baseImages(df dockerfile) []string {
	stages := map[string]bool{}
	var out []string
	for _, in := range df.instructions {
		if in.cmd != "FROM" {
			continue
		}
		var words []string
		for _, w := range strings.Fields(in.rest) {
			if !strings.HasPrefix(w, "--") {
				words = append(words, w)
			}
		}
		if len(words) == 0 {
			continue
		}
		img := dockerVar.ReplaceAllStringFunc(words[0], func(m string) string {
			return df.args[dockerVar.FindStringSubmatch(m)[1]]
		})
		if !stages[img] && !slices.Contains(out, img) {
			out = append(out, img)
		}
		if len(words) == 3 && strings.EqualFold(words[1], "AS") {
			stages[words[2]] = true
		}
	}
	return out
}

func lastLines(b []byte, n int) []byte {
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}
