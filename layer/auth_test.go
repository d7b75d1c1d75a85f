package layer

// Authentication and TLS options that resilience_test.go does not exercise (S19, C21), each
// against an embedded nats-server configured in Go: a .creds file (operator, account and user
// JWTs with a memory account resolver), an nkey seed file, mutual TLS with a client certificate,
// and the TLS-first handshake. Each works with the right material and fails without it, and the
// server's own view (Connz) confirms which identity or handshake the connection used.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ---------------------------------------------------------------------------------------------
// helpers

func authMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// authWriteFile writes content to dir/name, readable by the owner only, and returns the path.
func authWriteFile(t *testing.T, dir, name string, content []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	authMust(t, os.WriteFile(path, content, 0o600))
	return path
}

// authConnectFails requires that Connect with cfg fails (within a 1 s connect timeout) and
// returns the error.
func authConnectFails(t *testing.T, cfg Config, what string) error {
	t.Helper()
	cfg.Connection.ConnectTimeout = time.Second
	l, err := Connect(ctxT(t, 10*time.Second), cfg)
	if err == nil {
		_ = l.Close()
		t.Fatalf("%s: the connect succeeded", what)
	}
	t.Logf("%s: %v", what, err)
	return err
}

// authConnInfo is the server's view (with the authentication details) of the client connection
// named name.
func authConnInfo(t *testing.T, s *testServer, name string) *server.ConnInfo {
	t.Helper()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	cz, err := srv.Connz(&server.ConnzOptions{Username: true})
	authMust(t, err)
	for _, c := range cz.Conns {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("the server has no connection named %q", name)
	return nil
}

// authUserCreds makes a user signed by account key akp and writes its .creds file (user JWT
// and seed) to dir/name. It returns the path, the user's public key and its seed.
func authUserCreds(t *testing.T, akp nkeys.KeyPair, dir, name string) (path, userPub, seed string) {
	t.Helper()
	ukp, err := nkeys.CreateUser()
	authMust(t, err)
	userPub, err = ukp.PublicKey()
	authMust(t, err)
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	userJWT, err := uc.Encode(akp)
	authMust(t, err)
	rawSeed, err := ukp.Seed()
	authMust(t, err)
	creds, err := jwt.FormatUserConfig(userJWT, rawSeed)
	authMust(t, err)
	return authWriteFile(t, dir, name, creds), userPub, string(rawSeed)
}

// authTLSFiles are PEM files for mutual TLS: a CA, a server certificate for 127.0.0.1 and a
// client certificate, both signed by the CA, and a client certificate of another CA.
type authTLSFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCert, otherKey string
}

// authCA is a CA that signs the leaf certificates of one test.
type authCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
}

func authNewCA(t *testing.T, name string) authCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	authMust(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	authMust(t, err)
	cert, err := x509.ParseCertificate(der)
	authMust(t, err)
	return authCA{cert, key, der}
}

// leaf writes a certificate signed by ca, with its key, to dir and returns both paths.
func (ca authCA) leaf(t *testing.T, dir, name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	authMust(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	authMust(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	authMust(t, err)
	certFile = authWriteFile(t, dir, name+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyFile = authWriteFile(t, dir, name+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

// authWriteTLSFiles writes fresh mutual-TLS material (ECDSA P-256). rsWriteTLSFiles of
// resilience_test.go does not fit: it makes no client certificate and keeps no CA key.
func authWriteTLSFiles(t *testing.T) authTLSFiles {
	t.Helper()
	dir := t.TempDir()
	ca := authNewCA(t, "channels-nats auth test CA")
	other := authNewCA(t, "channels-nats untrusted CA")
	var f authTLSFiles
	f.ca = authWriteFile(t, dir, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.der}))
	f.serverCert, f.serverKey = ca.leaf(t, dir, "server", 2, x509.ExtKeyUsageServerAuth)
	f.clientCert, f.clientKey = ca.leaf(t, dir, "client", 3, x509.ExtKeyUsageClientAuth)
	f.otherCert, f.otherKey = other.leaf(t, dir, "other-client", 2, x509.ExtKeyUsageClientAuth)
	return f
}

// authNamed is a test config for url with a connection name and a short connect timeout.
func authNamed(name, url string) Config {
	cfg := msgNamed(nil, name, url)
	cfg.Connection.ConnectTimeout = 2 * time.Second
	return cfg
}

// ---------------------------------------------------------------------------------------------
// S19, C21

// TestAuthCredsFile (S19 creds, C21): a server in operator mode with a memory account resolver
// that holds one account. A .creds file of a user of that account connects (the server sees that
// user and account) and carries traffic; the .creds file of a user whose account the server does
// not trust is refused with an authorization error that shows no seed.
func TestAuthCredsFile(t *testing.T) {
	okp, err := nkeys.CreateOperator()
	authMust(t, err)
	opPub, err := okp.PublicKey()
	authMust(t, err)
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "channels-nats-test-operator"
	opJWT, err := oc.Encode(okp)
	authMust(t, err)
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	authMust(t, err)

	akp, err := nkeys.CreateAccount()
	authMust(t, err)
	accPub, err := akp.PublicKey()
	authMust(t, err)
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "channels-nats-test-account"
	accJWT, err := ac.Encode(okp)
	authMust(t, err)
	resolver := &server.MemAccResolver{}
	authMust(t, resolver.Store(accPub, accJWT))

	s := startServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
		o.AccountResolver = resolver
	})
	dir := t.TempDir()
	creds, userPub, _ := authUserCreds(t, akp, dir, "user.creds")
	cfg := authNamed("auth-creds", s.url())
	cfg.Connection.CredsFile = creds
	a := connect(t, cfg)
	rsRoundTripOn(t, a)
	if ci := authConnInfo(t, s, "auth-creds"); ci.AuthorizedUser != userPub || ci.Account != accPub {
		t.Errorf("the server sees user %q in account %q, want %q in %q", ci.AuthorizedUser, ci.Account, userPub, accPub)
	}

	// A user of an account the operator never signed and the resolver does not know.
	strangerAccount, err := nkeys.CreateAccount()
	authMust(t, err)
	untrusted, _, seed := authUserCreds(t, strangerAccount, dir, "untrusted.creds")
	bad := authNamed("auth-creds-untrusted", s.url())
	bad.Connection.CredsFile = untrusted
	err = authConnectFails(t, bad, "a .creds file of an untrusted account")
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("untrusted .creds: %v, want an authorization violation", err)
	}
	if strings.Contains(err.Error(), seed) {
		t.Errorf("the error shows the user's seed: %v", err)
	}
	missing := authNamed("auth-creds-missing", s.url())
	missing.Connection.CredsFile = filepath.Join(dir, "no-such.creds")
	authConnectFails(t, missing, "a .creds file that does not exist")
}

// TestAuthNkeySeedFile (S19 nkey_seed, C21): a server that knows one nkey user. The seed file of
// that user connects (the server sees its public key) and carries traffic; another user's seed
// is refused with an authorization error; a seed file that does not exist is an error naming
// nkey_seed.
func TestAuthNkeySeedFile(t *testing.T) {
	ukp, err := nkeys.CreateUser()
	authMust(t, err)
	pub, err := ukp.PublicKey()
	authMust(t, err)
	seed, err := ukp.Seed()
	authMust(t, err)
	s := startServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	dir := t.TempDir()

	cfg := authNamed("auth-nkey", s.url())
	cfg.Connection.NkeySeedFile = authWriteFile(t, dir, "user.nk", seed)
	a := connect(t, cfg)
	rsRoundTripOn(t, a)
	if ci := authConnInfo(t, s, "auth-nkey"); ci.AuthorizedUser != pub {
		t.Errorf("the server sees user %q, want nkey %q", ci.AuthorizedUser, pub)
	}

	other, err := nkeys.CreateUser()
	authMust(t, err)
	otherSeed, err := other.Seed()
	authMust(t, err)
	wrong := authNamed("auth-nkey-wrong", s.url())
	wrong.Connection.NkeySeedFile = authWriteFile(t, dir, "other.nk", otherSeed)
	err = authConnectFails(t, wrong, "the seed of an unknown nkey user")
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("wrong seed: %v, want an authorization violation", err)
	}
	if strings.Contains(err.Error(), string(otherSeed)) {
		t.Errorf("the error shows the seed: %v", err)
	}
	missing := authNamed("auth-nkey-missing", s.url())
	missing.Connection.NkeySeedFile = filepath.Join(dir, "no-such.nk")
	if err := authConnectFails(t, missing, "a seed file that does not exist"); !strings.Contains(err.Error(), "nkey_seed") {
		t.Errorf("missing seed file: %v, want an error naming nkey_seed", err)
	}
}

// TestAuthMutualTLS (S19 tls_cert/tls_key/tls_ca, C21): a server that requires and verifies
// client certificates. The client certificate signed by the server's CA connects (the server
// sees it) and carries traffic between two layers; without a client certificate, or with one
// of another CA, the connect fails.
func TestAuthMutualTLS(t *testing.T) {
	f := authWriteTLSFiles(t)
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: f.serverCert, KeyFile: f.serverKey, CaFile: f.ca, Verify: true,
	})
	authMust(t, err)
	s := startServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, tlsConfig, 2
	})
	tlsURL := fmt.Sprintf("tls://127.0.0.1:%d", s.opts.Port)

	withCert := func(name, cert, key string) Config {
		cfg := authNamed(name, tlsURL)
		cfg.Connection.TLSCAFile, cfg.Connection.TLSCertFile, cfg.Connection.TLSKeyFile = f.ca, cert, key
		return cfg
	}
	a := connect(t, withCert("auth-mtls-a", f.clientCert, f.clientKey))
	b := connect(t, withCert("auth-mtls-b", f.clientCert, f.clientKey))
	rsRoundTripOn(t, a)
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	authMust(t, err)
	authMust(t, b.Send(ctx, pc, rsMsg("mtls")))
	rsExpect(t, "send between two layers over mutual TLS", a, pc, "mtls")
	if _, err := rsConn(a).TLSConnectionState(); err != nil {
		t.Errorf("the connection does not use TLS: %v", err)
	}
	ci := authConnInfo(t, s, "auth-mtls-a")
	if ci.TLSVersion == "" || len(ci.TLSPeerCerts) != 1 || !strings.Contains(ci.TLSPeerCerts[0].Subject, "client") {
		t.Errorf("the server's view of the client: TLS %q, peer certificates %+v; want the client certificate", ci.TLSVersion, ci.TLSPeerCerts)
	}

	// That these refusals fail at once, not at connect_deadline, is TestAuthTLSRefusalIsNotRetried's.
	noCert := authNamed("auth-mtls-none", tlsURL)
	noCert.Connection.TLSCAFile = f.ca
	noCert.ConnectDeadline = time.Second
	authConnectFails(t, noCert, "TLS without a client certificate")
	other := withCert("auth-mtls-other", f.otherCert, f.otherKey)
	other.ConnectDeadline = time.Second
	authConnectFails(t, other, "a client certificate of another CA")
}

// TestAuthTLSRefusalIsNotRetried (S19, connect_deadline): a server that requires a client
// certificate refuses a client without one, or with one of another CA, in the TLS handshake.
// Another try would be refused the same way, so Connect must fail at once, as it does for a
// wrong token, instead of retrying until connect_deadline.
func TestAuthTLSRefusalIsNotRetried(t *testing.T) {
	f := authWriteTLSFiles(t)
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: f.serverCert, KeyFile: f.serverKey, CaFile: f.ca, Verify: true,
	})
	authMust(t, err)
	s := startServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSConfig, o.TLSTimeout = true, true, tlsConfig, 2
	})
	tlsURL := fmt.Sprintf("tls://127.0.0.1:%d", s.opts.Port)
	noCert := authNamed("auth-refused-none", tlsURL)
	noCert.Connection.TLSCAFile = f.ca
	other := authNamed("auth-refused-other", tlsURL)
	other.Connection.TLSCAFile, other.Connection.TLSCertFile, other.Connection.TLSKeyFile = f.ca, f.otherCert, f.otherKey
	for what, cfg := range map[string]Config{"no client certificate": noCert, "a client certificate of another CA": other} {
		cfg.ConnectDeadline = 3 * time.Second
		start := time.Now()
		err := authConnectFails(t, cfg, what)
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: the TLS refusal was retried for %s (connect_deadline 3s); it must fail at once: %v", what, d, err)
		}
	}
}

// TestAuthTLSFirst (S19 tls_handshake_first, C21): a server that does the TLS handshake before
// its INFO. TLSFirst connects (the server reports a TLS-first connection) and carries traffic;
// the same configuration without TLSFirst waits for an INFO that never comes, retries like with
// a server that does not answer, and fails at connect_deadline.
func TestAuthTLSFirst(t *testing.T) {
	caFile, certFile, keyFile := rsWriteTLSFiles(t)
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: certFile, KeyFile: keyFile})
	authMust(t, err)
	s := startServer(t, func(o *server.Options) {
		o.TLS, o.TLSConfig, o.TLSTimeout, o.TLSHandshakeFirst = true, tlsConfig, 2, true
	})
	tlsURL := fmt.Sprintf("tls://127.0.0.1:%d", s.opts.Port)

	cfg := authNamed("auth-tls-first", tlsURL)
	cfg.Connection.TLSCAFile, cfg.Connection.TLSFirst = caFile, true
	a := connect(t, cfg)
	rsRoundTripOn(t, a)
	if ci := authConnInfo(t, s, "auth-tls-first"); !ci.TLSFirst || ci.TLSVersion == "" {
		t.Errorf("the server's view: TLSFirst %v, TLS %q; want a TLS-first connection", ci.TLSFirst, ci.TLSVersion)
	}

	cfg.Connection.Name, cfg.Connection.TLSFirst = "auth-tls-late", false
	cfg.ConnectDeadline = 1500 * time.Millisecond
	start := time.Now()
	err = authConnectFails(t, cfg, "a connect without TLSFirst to a TLS-first server")
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the failing connect took %s with a 1.5 s connect deadline", d)
	}
	if !strings.Contains(err.Error(), "connect_deadline") {
		t.Errorf("the error does not name connect_deadline: %v", err)
	}
}
