package tempserver

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestTLSRedis: the server speaks TLS only, a client trusting its CA gets in, one
// trusting another CA or speaking plain TCP does not; a restart keeps TLS.
func TestTLSRedis(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := StartTLSRedis(ctx, RedisOptions{Args: []string{"--requirepass", "pw-tls"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !strings.HasPrefix(r.URL(), "rediss://127.0.0.1:") {
		t.Fatalf("URL %q", r.URL())
	}
	u, _ := url.Parse(r.URL())
	u.User = url.UserPassword("default", "pw-tls")
	ping := func(opt *redis.Options) error {
		opt.MaxRetries = -1
		c := redis.NewClient(opt)
		defer c.Close()
		return c.Ping(ctx).Err()
	}
	opt, err := r.Options(u.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := ping(opt); err != nil {
		t.Fatalf("TLS ping with the CA: %v", err)
	}

	// Plain TCP on the same port: no reply a Redis client accepts.
	plain := &redis.Options{Addr: r.Addr(), Password: "pw-tls", DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second}
	if err := ping(plain); err == nil {
		t.Error("plain TCP ping succeeded on the TLS port")
	}
	// Another CA: certificate verification fails.
	other, err := WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bad, _ := redis.ParseURL(u.String())
	bad.TLSConfig = other.ClientConfig("127.0.0.1")
	if err := ping(bad); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("ping trusting another CA: %v, want a certificate error", err)
	}
	// The system roots do not know the CA.
	sys, _ := redis.ParseURL(u.String())
	if err := ping(sys); err == nil {
		t.Error("ping trusting the system roots succeeded")
	}

	r.Kill()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	opt, _ = r.Options(u.String())
	if err := ping(opt); err != nil {
		t.Fatalf("TLS ping after a restart: %v", err)
	}
	if _, err := r.Options("redis://127.0.0.1:1"); err == nil {
		t.Error("Options accepted a redis:// URL")
	}
}

// TestTLSPostgres: verify-full with the CA works and the session is encrypted; no
// TLS, another CA, a wrong password are refused; the key file belongs to the
// server's user with mode 0600; databases created on it keep the TLS settings.
func TestTLSPostgres(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, files, err := StartTLSPostgres(ctx, TLSPostgresOptions{Password: "pw-pg-tls"})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if err := CheckTLS(ctx, pg.URL()); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(files.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}

	u, _ := url.Parse(pg.URL())
	with := func(key, value string) string {
		v := *u
		q := v.Query()
		q.Set(key, value)
		v.RawQuery = q.Encode()
		return v.String()
	}
	connect := func(s string) error {
		c, err := pgx.Connect(ctx, s)
		if err == nil {
			c.Close(ctx)
		}
		return err
	}
	if err := connect(with("sslmode", "disable")); err == nil {
		t.Error("a connection without TLS was accepted")
	}
	other, err := WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := connect(with("sslrootcert", other.CAFile)); err == nil {
		t.Error("verify-full accepted a server certificate of another CA")
	}
	wrong := *u
	wrong.User = url.UserPassword("postgres", "not-the-password")
	if err := connect(wrong.String()); err == nil {
		t.Error("a wrong password was accepted")
	}

	db, err := CreateDatabase(ctx, pg.URL(), "tlsdb", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(db, "sslmode=verify-full") || !strings.Contains(db, "/tlsdb") {
		t.Errorf("database URL %q lost the TLS settings", redactedURL(db))
	}
	if err := CheckTLS(ctx, db); err != nil {
		t.Fatal(err)
	}

	pg.Stop()
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := CheckTLS(ctx, db); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}
