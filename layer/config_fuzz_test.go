package layer

import (
	"strings"
	"testing"
	"time"
)

// configSeeds are documents for FuzzParseConfig: valid ones and hostile ones (wrong types, deep
// nesting, huge numbers, NaN-like strings, unknown keys, null everywhere, a 1 MB string).
func configSeeds() []string {
	deep := strings.Repeat(`{"connect_options":`, 200) + `{}` + strings.Repeat(`}`, 200)
	deepList := `{"servers":` + strings.Repeat(`[`, 5000) + strings.Repeat(`]`, 5000) + `}`
	huge := `{"prefix":"` + strings.Repeat("a", 1<<20) + `"}`
	return []string{
		`{}`,
		`{"servers":["nats://127.0.0.1:4222"],"prefix":"channels","expiry":60,"capacity":100,` +
			`"channel_capacity":{"http.request*":200,"[!a]?":3},"group_expiry":86400,"mailbox_grace":60,` +
			`"release_linger":0.3,"connect_options":{"name":"web","token":"s3cret","max_reconnect_attempts":0}}`,
		`{"servers":"nats://a:4222, nats://b:4222","channel_capacity":[{"regex":"^x.*","capacity":1},{"pattern":"y*","capacity":2}]}`,
		`{"servers":null,"prefix":null,"expiry":null,"capacity":null,"channel_capacity":null,"group_expiry":null,` +
			`"mailbox_grace":null,"release_linger":null,"connect_options":null}`,
		`{"connect_options":{"name":null,"token":null,"max_reconnect_attempts":null,"connect_timeout":null}}`,
		`{"expiry":1e308,"group_expiry":-1e308,"mailbox_grace":9223372036.854775807,"release_linger":1e-300}`,
		`{"capacity":1e30}`,
		`{"capacity":-1}`,
		`{"capacity":99999999999999999999999999999}`,
		`{"expiry":"NaN"}`,
		`{"expiry":"Infinity","capacity":"1"}`,
		`{"expiry":-0}`,
		`{"expiry":1e10}`,
		`{"expiry":-1e-10}`,
		`{"channel_capacity":{"(":1}}`,
		`{"channel_capacity":[{"regex":"(","capacity":1}]}`,
		`{"channel_capacity":[{"regex":"a","pattern":"b","capacity":1}]}`,
		`{"channel_capacity":[null,{"capacity":5}]}`,
		`{"channel_capacity":{"a":1e30}}`,
		`{"channel_capacity":{"a":0}}`,
		`{"channel_capacity":{"[":1,"[]":2,"[!]":3,"[]]":4,"[!]]":5,"\u00ff[\u0100-\u0000]":6}}`,
		`{"channel_capacity":"*"}`,
		`{"channel_capacity":7}`,
		`{"servers":[1,2,3]}`,
		`{"servers":["", " "]}`,
		`{"servers":"a,,b"}`,
		`{"servers":{"a":1}}`,
		`{"prefix":"a..b"}`,
		`{"prefix":"*"}`,
		`{"prefix":"a b"}`,
		`{"unknown":1}`,
		`{"connect_options":{"unknown":true}}`,
		`{"connect_options":{"max_reconnect_attempts":-3}}`,
		`{"connect_options":{"max_reconnect_attempts":-2,"pending_msgs_limit":-1}}`,
		`{"connect_options":{"tls_cert":"x"}}`,
		`{"connect_options":{"pending_size":1e40,"connect_timeout":-5}}`,
		`{"connect_options":{"ping_interval":-1,"max_pings_outstanding":-1}}`,
		`{"connect_deadline":-1,"publish_deadline":1e300}`,
		`{"connect_options":[]}`,
		`{"connect_options":"x"}`,
		`{} {}`,
		`{}garbage`,
		`[]`,
		`null`,
		`"x"`,
		`{"expiry":1,"expiry":-1}`,
		``,
		"\x00\xff",
		deep,
		deepList,
		huge,
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range configSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		c, err := ParseConfig(doc)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("ParseConfig returned an empty error")
			}
			return
		}
		d, err := c.WithDefaults()
		if err != nil {
			return
		}
		checkSaneConfig(t, d)
	})
}

// checkSaneConfig asserts what WithDefaults promises of a config it accepted.
func checkSaneConfig(t *testing.T, c Config) {
	t.Helper()
	durations := map[string]time.Duration{
		"expiry": c.Expiry, "group_expiry": c.GroupExpiry, "mailbox_grace": c.MailboxGrace,
		"release_linger": c.ReleaseLinger, "reconnect_wait": c.Connection.ReconnectWait,
		"connect_timeout": c.Connection.ConnectTimeout, "drain_timeout": c.Connection.DrainTimeout,
		"flush_timeout": c.Connection.FlushTimeout, "connect_deadline": c.ConnectDeadline,
		"publish_deadline": c.PublishDeadline, "ping_interval": c.Connection.PingInterval,
	}
	for name, d := range durations {
		if d <= 0 { // zero is replaced by the default, negative is refused
			t.Fatalf("accepted config has %s = %v", name, d)
		}
	}
	if c.Capacity <= 0 {
		t.Fatalf("accepted config has capacity %d", c.Capacity)
	}
	if c.Connection.PendingMsgsLimit <= 0 || c.Connection.PendingSize <= 0 || c.Connection.MaxPingsOutstanding <= 0 {
		t.Fatalf("accepted config has pending_msgs_limit %d, pending_size %d, max_pings_outstanding %d",
			c.Connection.PendingMsgsLimit, c.Connection.PendingSize, c.Connection.MaxPingsOutstanding)
	}
	if c.Connection.MaxReconnects == 0 || c.Connection.MaxReconnects < NoReconnect {
		t.Fatalf("accepted config has max_reconnects %d", c.Connection.MaxReconnects)
	}
	if len(c.Servers) == 0 {
		t.Fatal("accepted config has no servers")
	}
	for _, s := range c.Servers {
		if strings.TrimSpace(s) == "" {
			t.Fatalf("accepted config has a blank server in %q", c.Servers)
		}
	}
	if err := validatePrefix(c.Prefix); err != nil {
		t.Fatalf("accepted config has an invalid prefix %q: %v", c.Prefix, err)
	}
	if c.Log == nil {
		t.Fatal("accepted config has no Log")
	}
	for i, r := range c.ChannelCapacity {
		if r.compiled == nil || r.Capacity < 1 || (r.Pattern == "") == (r.Regex == "") {
			t.Fatalf("accepted channel_capacity rule %d is not sane: %+v", i, r)
		}
	}
	for _, name := range []string{"", "x", "http.request", "specific.abc!def", strings.Repeat("z", 99)} {
		if got := c.capacityOf(name); got < 1 {
			t.Fatalf("capacityOf(%q) = %d", name, got)
		}
	}
}
