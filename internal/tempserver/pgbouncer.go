package tempserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrNoPgBouncer says that the pgbouncer binary is not installed (Debian/Ubuntu:
// apt-get install pgbouncer). There is no Docker fallback: tests skip.
var ErrNoPgBouncer = errors.New("tempserver: pgbouncer not found (apt-get install pgbouncer)")

// PgBouncer is a PgBouncer in transaction pooling mode, in front of one
// PostgreSQL server, that this process owns.
type PgBouncer struct {
	dir  string
	port int
	proc *process
}

// StartPgBouncer starts a PgBouncer from the local binary, pooling in transaction
// mode the connections to the server of upstream (a postgres:// URL whose user the
// server trusts; every database of it is served). It returns ErrNoPgBouncer when the
// binary is not installed.
func StartPgBouncer(ctx context.Context, upstream string) (*PgBouncer, error) {
	bin, err := lookPath("pgbouncer", "/usr/sbin", "/opt/homebrew/bin")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoPgBouncer, err)
	}
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, fmt.Errorf("tempserver: upstream URL: %w", err)
	}
	host, upPort, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil, fmt.Errorf("tempserver: upstream URL host: %w", err)
	}
	// PgBouncer refuses to run as root.
	as, err := unprivileged("postgres")
	if err != nil {
		return nil, err
	}
	dir, err := as.mkdirFor("", "delayq-pgbouncer-*")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &PgBouncer{dir: dir, port: port}
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s user=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,search_path
logfile = %s
pidfile =
`, host, upPort, u.User.Username(), port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"))
	users := fmt.Sprintf("%q \"\"\n", u.User.Username())
	for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": users} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if as.set {
			_ = os.Chown(p, int(as.uid), int(as.gid))
		}
	}
	logPath := filepath.Join(dir, "stderr.log")
	proc, err := startProcess(as.command(bin, filepath.Join(dir, "pgbouncer.ini")), logPath)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start pgbouncer: %w", err)
	}
	b.proc = proc
	err = waitReady(ctx, proc.exited, func() string { return tail(logPath) + tail(filepath.Join(dir, "pgbouncer.log")) },
		func(ctx context.Context) error {
			conn, err := net.DialTimeout("tcp", b.Addr(), time.Second)
			if err != nil {
				return err
			}
			return conn.Close()
		})
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Addr is the host:port PgBouncer listens on.
func (b *PgBouncer) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// URL returns dbURL (a URL of the upstream server) rewritten to go through
// PgBouncer, with pgx's simple protocol (PgBouncer's transaction mode keeps no
// prepared statement between transactions).
func (b *PgBouncer) URL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", err
	}
	u.Host = b.Addr()
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Close stops PgBouncer and removes its directory.
func (b *PgBouncer) Close() {
	b.proc.stop(syscall.SIGTERM, 10*time.Second)
	_ = os.RemoveAll(b.dir)
}
