package tempserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TLSFiles are a throwaway certificate authority and one server certificate it
// signed, valid for 127.0.0.1, ::1 and localhost for a day, as PEM files.
type TLSFiles struct {
	// CAFile is the CA certificate: what a client trusts (sslrootcert=,
	// SSL_CERT_FILE=, tls.Config.RootCAs).
	CAFile string
	// CertFile and KeyFile are the server's certificate and private key.
	CertFile, KeyFile string
	// CAPool holds the CA certificate.
	CAPool *x509.CertPool
}

// ClientConfig returns a TLS client configuration that trusts the CA only and
// verifies the server's name (an IP address or "localhost").
func (f *TLSFiles) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{RootCAs: f.CAPool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// WriteTLSFiles makes a new CA and a server certificate signed by it, and writes
// them into dir as ca.pem, server.pem and server.key (mode 0600).
func WriteTLSFiles(dir string) (*TLSFiles, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "delayq test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("tempserver: CA certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("tempserver: server certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	f := &TLSFiles{
		CAFile:   filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "server.pem"),
		KeyFile:  filepath.Join(dir, "server.key"),
		CAPool:   x509.NewCertPool(),
	}
	f.CAPool.AddCert(caCert)
	for _, w := range []struct {
		path, kind string
		der        []byte
		mode       os.FileMode
	}{
		{f.CAFile, "CERTIFICATE", caDER, 0o644},
		{f.CertFile, "CERTIFICATE", der, 0o644},
		{f.KeyFile, "PRIVATE KEY", keyDER, 0o600},
	} {
		b := pem.EncodeToMemory(&pem.Block{Type: w.kind, Bytes: w.der})
		if err := os.WriteFile(w.path, b, w.mode); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n.Add(n, big.NewInt(1))
}

// chown gives the files to the server's user (PostgreSQL refuses a key file that
// is not its own, or that others can read).
func (r runAs) chown(paths ...string) error {
	if !r.set {
		return nil
	}
	for _, p := range paths {
		if err := os.Chown(p, int(r.uid), int(r.gid)); err != nil {
			return err
		}
	}
	return nil
}

// TLSRedis is a Redis server this process owns that accepts TLS connections only
// (no plain port), with a certificate from its own throwaway CA. Clients need no
// certificate of their own. Like Redis, it keeps nothing across a restart.
type TLSRedis struct {
	r     *Redis
	files *TLSFiles
	tport int
}

// StartTLSRedis starts a TLS-only server from a local redis-server binary (there
// is no Docker fallback). opts.Args are added to its arguments, e.g. "--user",
// "relay", "on", ">secret", "~dq:*", "+ping", or "--requirepass", "secret".
func StartTLSRedis(ctx context.Context, opts RedisOptions) (*TLSRedis, error) {
	bin, err := RedisBinary("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: TLS Redis needs a local redis-server: %s", ErrNoServer, InstallBinaries)
	}
	dir, err := os.MkdirTemp("", "delayq-redis-tls-")
	if err != nil {
		return nil, err
	}
	files, err := WriteTLSFiles(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	t := &TLSRedis{r: &Redis{bin: bin, dir: dir, args: opts.Args}, files: files, tport: port}
	t.r.url = fmt.Sprintf("rediss://127.0.0.1:%d/0", port)
	if err := t.Start(ctx); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// URL is the server's rediss:// URL, without credentials. A client built from it
// with redis.ParseURL verifies the certificate against the system's roots: give it
// the CA with Options, or point SSL_CERT_FILE at TLS().CAFile in a child process.
func (t *TLSRedis) URL() string { return t.r.URL() }

// Addr is host:port of the TLS port.
func (t *TLSRedis) Addr() string { return t.r.Addr() }

// TLS returns the CA and certificate files.
func (t *TLSRedis) TLS() *TLSFiles { return t.files }

// Options parses a rediss:// URL of this server (with a user and password, say)
// and makes its client trust the server's CA.
func (t *TLSRedis) Options(rawURL string) (*redis.Options, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if opt.TLSConfig == nil {
		return nil, fmt.Errorf("tempserver: %s is not a rediss:// URL", redactedURL(rawURL))
	}
	opt.TLSConfig.RootCAs = t.files.CAPool
	return opt, nil
}

// Start starts a stopped server again on the same port, empty.
func (t *TLSRedis) Start(ctx context.Context) error {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc != nil {
		return nil
	}
	args := append([]string{"--port", "0", "--tls-port", strconv.Itoa(t.tport), "--bind", "127.0.0.1",
		"--tls-cert-file", t.files.CertFile, "--tls-key-file", t.files.KeyFile,
		"--tls-ca-cert-file", t.files.CAFile, "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no"}, r.args...)
	logPath := filepath.Join(r.dir, "redis.log")
	proc, err := startProcess(runAs{}.command(r.bin, args...), logPath)
	if err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	r.proc = proc
	err = waitReady(ctx, proc.exited, func() string { return tail(logPath) }, func(ctx context.Context) error {
		conn, err := net.DialTimeout("tcp", t.Addr(), time.Second)
		if err != nil {
			return err
		}
		conn.Close()
		opt, err := t.Options(t.URL())
		if err != nil {
			return err
		}
		c := redis.NewClient(opt)
		defer c.Close()
		err = c.Ping(ctx).Err()
		if err != nil && isAuthError(err) {
			return nil // up, and asking for a password we were not given here
		}
		return err
	})
	if err != nil {
		proc.stop(syscall.SIGKILL, time.Second)
		r.proc = nil
		return err
	}
	return nil
}

// Stop shuts the server down.
func (t *TLSRedis) Stop() { t.r.Stop() }

// Kill ends the server at once.
func (t *TLSRedis) Kill() { t.r.Kill() }

// Close stops the server and removes its directory, certificates included.
func (t *TLSRedis) Close() { t.r.Close() }

// TLSPostgresOptions tune a TLS-only PostgreSQL server.
type TLSPostgresOptions struct {
	PostgresOptions
	// Password is the superuser's (postgres) password, asked for on every TCP
	// connection (scram-sha-256). Default none: TCP connections are trusted, but
	// still only over TLS.
	Password string
}

// StartTLSPostgres starts a local PostgreSQL server (there is no Docker fallback)
// with ssl=on and a certificate from its own throwaway CA, that refuses TCP
// connections without TLS (pg_hba: hostssl only). Its URL asks for
// sslmode=verify-full with the CA as sslrootcert; CreateDatabase keeps both.
func StartTLSPostgres(ctx context.Context, opts TLSPostgresOptions) (*Postgres, *TLSFiles, error) {
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 300
	}
	initdb, err := PostgresBinary("initdb")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: TLS PostgreSQL needs local binaries: %s", ErrNoServer, InstallBinaries)
	}
	bin := filepath.Dir(initdb)
	as, err := unprivileged("postgres")
	if err != nil {
		return nil, nil, err
	}
	dir, err := as.mkdirFor("", "delayq-pg-tls-")
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*Postgres, *TLSFiles, error) {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	initArgs := []string{"-D", filepath.Join(dir, "data"), "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"}
	if opts.Password != "" {
		pwFile := filepath.Join(dir, "pw")
		if err := os.WriteFile(pwFile, []byte(opts.Password+"\n"), 0o600); err != nil {
			return fail(err)
		}
		if err := as.chown(pwFile); err != nil {
			return fail(err)
		}
		defer os.Remove(pwFile)
		initArgs = append(initArgs, "--pwfile", pwFile)
	}
	if out, err := as.command(filepath.Join(bin, "initdb"), initArgs...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, out))
	}
	files, err := WriteTLSFiles(dir)
	if err != nil {
		return fail(err)
	}
	if err := as.chown(files.CAFile, files.CertFile, files.KeyFile); err != nil {
		return fail(err)
	}
	method := "trust"
	if opts.Password != "" {
		method = "scram-sha-256"
	}
	data := filepath.Join(dir, "data")
	hba := "local all all trust\n" +
		"hostssl all all 127.0.0.1/32 " + method + "\n" +
		"hostssl all all ::1/128 " + method + "\n" +
		"hostnossl all all 0.0.0.0/0 reject\n" +
		"hostnossl all all ::/0 reject\n"
	conf := fmt.Sprintf("\nssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\nssl_ca_file = '%s'\n"+
		"password_encryption = 'scram-sha-256'\n", files.CertFile, files.KeyFile, files.CAFile)
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fail(err)
	}
	cf, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fail(err)
	}
	_, err = cf.WriteString(conf)
	if cerr := cf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	if err := as.chown(filepath.Join(data, "pg_hba.conf")); err != nil {
		return fail(err)
	}
	pg := &Postgres{bin: bin, dir: dir, opts: opts.PostgresOptions, as: as}
	if pg.port, err = freePort(); err != nil {
		return fail(err)
	}
	u := &url.URL{Scheme: "postgres", Host: "127.0.0.1:" + strconv.Itoa(pg.port), Path: "/postgres",
		RawQuery: url.Values{"sslmode": {"verify-full"}, "sslrootcert": {files.CAFile}}.Encode()}
	if opts.Password != "" {
		u.User = url.UserPassword("postgres", opts.Password)
	} else {
		u.User = url.User("postgres")
	}
	pg.url = u.String()
	if err := pg.Start(ctx); err != nil {
		pg.Close()
		return nil, nil, err
	}
	return pg, files, nil
}

// CheckTLS connects to url and reports an error unless the session is encrypted
// (pg_stat_ssl), so a test can tell TLS from a silent plain fallback.
func CheckTLS(ctx context.Context, url string) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var ssl bool
	if err := c.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
		return err
	}
	if !ssl {
		return fmt.Errorf("tempserver: session to %s is not encrypted", redactedURL(url))
	}
	return nil
}

// redactedURL is u without its password, for errors.
func redactedURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return p.Redacted()
}
