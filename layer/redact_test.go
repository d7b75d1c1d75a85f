package layer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/testport"
	"github.com/nats-io/nats-server/v2/server"
)

// secretForms are server settings that carry a secret, in every form nats.go accepts or that a
// user may write, with the secret each one must never show.
func secretForms(port int) []struct{ server, secret string } {
	host := fmt.Sprintf("127.0.0.1:%d", port)
	return []struct{ server, secret string }{
		{"nats://user:s3cret-pw@" + host, "s3cret-pw"},
		{"nats://user:pass word@" + host, "pass word"},
		{"nats://user:pa/ss@" + host, "pa/ss"},
		{"nats://user:p@ss@" + host, "p@ss"},
		{"nats://tok3n-value@" + host, "tok3n-value"},
		{"tls://user:tls-pw@" + host, "tls-pw"},
		{"TOKEN-no-scheme@" + host, "TOKEN-no-scheme"},
		{"user:pw-no-scheme@" + host, "pw-no-scheme"},
		{"nats://user:p%40ss%2Fw@" + host, "p%40ss%2Fw"},
	}
}

func TestRedactorRemovesEverySecretForm(t *testing.T) {
	for _, form := range secretForms(4222) {
		cfg := Config{Servers: []string{form.server}}
		r := newRedactor(&cfg)
		texts := []string{
			form.server,
			"parse " + fmt.Sprintf("%q", form.server) + ": invalid userinfo",
			"cannot connect to " + form.server + ", nats://other:4222",
			"secret " + form.secret + " alone",
			"escaped " + strings.ReplaceAll(form.secret, " ", "%20"),
		}
		for _, text := range texts {
			if got := r.text(text); strings.Contains(got, form.secret) || strings.Contains(got, strings.ReplaceAll(form.secret, " ", "%20")) {
				t.Errorf("%s: %q was redacted to %q", form.server, text, got)
			}
		}
	}
	cfg := Config{Connection: ConnectionOptions{Token: "opt-token", Password: "opt-password"}}
	if got := newRedactor(&cfg).text("auth with opt-token and opt-password failed"); strings.Contains(got, "opt-") {
		t.Errorf("options not redacted: %q", got)
	}
	// Other URLs lose their user information too.
	if got := (&redactor{}).text("discovered nats://who:pw@10.0.0.1:4222"); strings.Contains(got, "pw") {
		t.Errorf("a discovered URL kept its password: %q", got)
	}
}

// TestConnectErrorsAndLogsShowNoSecret connects with every form to a port nobody listens on:
// neither the error nor any log record shows the secret.
func TestConnectErrorsAndLogsShowNoSecret(t *testing.T) {
	port := testport.Free(t)
	for _, form := range secretForms(port) {
		var mu sync.Mutex
		var records []string
		cfg := Config{
			Servers:         []string{form.server},
			ConnectDeadline: 300 * time.Millisecond,
			Log: func(_ Level, message string) {
				mu.Lock()
				records = append(records, message)
				mu.Unlock()
			},
		}
		_, err := Connect(context.Background(), cfg)
		if err == nil {
			t.Fatalf("%s: connected to a port nobody listens on", form.server)
		}
		if strings.Contains(err.Error(), form.secret) {
			t.Errorf("%s: the error shows the secret: %v", form.server, err)
		}
		mu.Lock()
		for _, record := range records {
			if strings.Contains(record, form.secret) {
				t.Errorf("%s: a log record shows the secret: %s", form.server, record)
			}
		}
		mu.Unlock()
	}
}

// TestLogRecordsOfAWorkingSettingShowNoSecret: a token in a URL without a scheme connects, and
// the records of the outage that follows show no secret.
func TestLogRecordsOfAWorkingSettingShowNoSecret(t *testing.T) {
	const token = "tok-en-in-a-url-without-scheme"
	srv := startServer(t, func(o *server.Options) { o.Authorization = token })
	var mu sync.Mutex
	var records []string
	l, err := Connect(context.Background(), Config{
		Servers: []string{fmt.Sprintf("%s@127.0.0.1:%d", token, srv.opts.Port)},
		Log: func(_ Level, message string) {
			mu.Lock()
			records = append(records, message)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("a token URL without a scheme did not connect: %v", err)
	}
	defer l.Close()
	srv.stop()
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Connected && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // reconnect attempts log their failures
	mu.Lock()
	defer mu.Unlock()
	if len(records) == 0 {
		t.Fatal("the outage was not logged")
	}
	for _, record := range records {
		if strings.Contains(record, token) {
			t.Errorf("a log record shows the token: %s", record)
		}
	}
}
