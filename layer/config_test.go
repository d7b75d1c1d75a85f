package layer

import (
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

const fullConfig = `{
	"servers": ["nats://a:4222", "tls://user:pw@b:4443"],
	"prefix": "my-app",
	"expiry": 30,
	"capacity": 250,
	"channel_capacity": {"http.request*": 200, "specific.*": 20},
	"group_expiry": 3600.5,
	"mailbox_grace": 12,
	"release_linger": 0.3,
	"connect_deadline": 2.5,
	"publish_deadline": 7,
	"host_reads": false,
	"connect_options": {
		"name": "web-1",
		"token": "s3cret",
		"user": "alice",
		"password": "hunter2",
		"creds": "/etc/nats/app.creds",
		"nkey_seed": "/etc/nats/seed.nk",
		"tls_cert": "/etc/nats/cert.pem",
		"tls_key": "/etc/nats/key.pem",
		"tls_ca": "/etc/nats/ca.pem",
		"tls_handshake_first": true,
		"dont_randomize": true,
		"reconnect_time_wait": 0.25,
		"max_reconnect_attempts": 7,
		"pending_size": 1048576,
		"connect_timeout": 1.5,
		"drain_timeout": 3,
		"flush_timeout": 0.75,
		"pending_msgs_limit": 1000,
		"ping_interval": 0.5,
		"max_pings_outstanding": 3
	}
}`

func TestParseConfigFull(t *testing.T) {
	c, err := ParseConfig([]byte(fullConfig))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := Config{
		Servers:         []string{"nats://a:4222", "tls://user:pw@b:4443"},
		Prefix:          "my-app",
		Expiry:          30 * time.Second,
		Capacity:        250,
		GroupExpiry:     3600*time.Second + 500*time.Millisecond,
		MailboxGrace:    12 * time.Second,
		ReleaseLinger:   300 * time.Millisecond,
		ConnectDeadline: 2500 * time.Millisecond,
		PublishDeadline: 7 * time.Second,
		NoHostReads:     true,
		Connection: ConnectionOptions{
			Name: "web-1", Token: "s3cret", User: "alice", Password: "hunter2",
			CredsFile: "/etc/nats/app.creds", NkeySeedFile: "/etc/nats/seed.nk",
			TLSCertFile: "/etc/nats/cert.pem", TLSKeyFile: "/etc/nats/key.pem", TLSCAFile: "/etc/nats/ca.pem",
			TLSFirst: true, NoRandomize: true, ReconnectWait: 250 * time.Millisecond, MaxReconnects: 7,
			PendingSize: 1 << 20, ConnectTimeout: 1500 * time.Millisecond,
			DrainTimeout: 3 * time.Second, FlushTimeout: 750 * time.Millisecond, PendingMsgsLimit: 1000,
			PingInterval: 500 * time.Millisecond, MaxPingsOutstanding: 3,
		},
	}
	rules := c.ChannelCapacity
	c.ChannelCapacity = nil
	if !reflect.DeepEqual(c, want) {
		t.Errorf("ParseConfig:\n got %+v\nwant %+v", c, want)
	}
	wantRules := []CapacityRule{{Pattern: "http.request*", Capacity: 200}, {Pattern: "specific.*", Capacity: 20}}
	if len(rules) != len(wantRules) {
		t.Fatalf("channel_capacity rules = %+v, want %+v", rules, wantRules)
	}
	for i := range rules {
		if rules[i].Pattern != wantRules[i].Pattern || rules[i].Regex != "" || rules[i].Capacity != wantRules[i].Capacity {
			t.Errorf("rule %d = %+v, want %+v", i, rules[i], wantRules[i])
		}
	}
	// The whole document is a valid configuration.
	c.ChannelCapacity = rules
	d, err := c.WithDefaults()
	if err != nil {
		t.Fatalf("WithDefaults: %v", err)
	}
	for name, want := range map[string]int{"http.request": 200, "http.request.body": 200, "specific.a!b": 20, "other": 250} {
		if got := d.capacityOf(name); got != want {
			t.Errorf("capacityOf(%q) = %d, want %d", name, got, want)
		}
	}
}

func TestParseConfigServers(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want []string
	}{
		{`{"servers": "nats://a:4222"}`, []string{"nats://a:4222"}},
		{`{"servers": "nats://a:4222,nats://b:4222"}`, []string{"nats://a:4222", "nats://b:4222"}},
		{`{"servers": " nats://a:4222 , nats://b:4222 "}`, []string{"nats://a:4222", "nats://b:4222"}},
		{`{"servers": ["nats://a:4222"]}`, []string{"nats://a:4222"}},
		{`{"servers": ["nats://a:4222", "nats://b:4222", "nats://c:4222"]}`, []string{"nats://a:4222", "nats://b:4222", "nats://c:4222"}},
		{`{"servers": null}`, nil},
		{`{}`, nil},
	} {
		c, err := ParseConfig([]byte(tc.doc))
		if err != nil {
			t.Errorf("ParseConfig(%s): %v", tc.doc, err)
			continue
		}
		if !reflect.DeepEqual(c.Servers, tc.want) {
			t.Errorf("ParseConfig(%s).Servers = %q, want %q", tc.doc, c.Servers, tc.want)
		}
	}
	c, err := ParseConfig([]byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.WithDefaults(); err != nil || !reflect.DeepEqual(d.Servers, []string{DefaultServer}) {
		t.Errorf("default servers = %q, %v; want [%s]", d.Servers, err, DefaultServer)
	}
	// An empty entry in a list is refused once the config is checked.
	c, err = ParseConfig([]byte(`{"servers": "nats://a:4222,"}`))
	if err == nil {
		_, err = c.WithDefaults()
	}
	if err == nil {
		t.Errorf(`servers "nats://a:4222," with an empty entry was accepted`)
	}
}

func TestParseConfigDurations(t *testing.T) {
	for _, tc := range []struct {
		seconds string
		want    time.Duration
	}{
		{"0.3", 300 * time.Millisecond},
		{"0.1", 100 * time.Millisecond},
		{"0.001", time.Millisecond},
		{"1.5", 1500 * time.Millisecond},
		{"60", time.Minute},
		{"86400", 24 * time.Hour},
		{"2e-3", 2 * time.Millisecond},
		{"0", 0},
		// Seconds are rounded to the nearest nanosecond, not truncated: 1.001 is the float
		// 1.000999999999999889..., which truncation would turn into 1.000999999s.
		{"1.001", 1001 * time.Millisecond},
		{"2.3", 2300 * time.Millisecond},
		{"0.000065", 65 * time.Microsecond},
	} {
		c, err := ParseConfig([]byte(`{"release_linger": ` + tc.seconds + `, "connect_options": {"drain_timeout": ` + tc.seconds + `}}`))
		if err != nil {
			t.Errorf("release_linger %s: %v", tc.seconds, err)
			continue
		}
		if c.ReleaseLinger != tc.want || c.Connection.DrainTimeout != tc.want {
			t.Errorf("%s seconds = %v and %v, want %v", tc.seconds, c.ReleaseLinger, c.Connection.DrainTimeout, tc.want)
		}
	}
}

// TestParseConfigHostReads: host_reads is on unless the document turns it off, and it must be a
// bool.
func TestParseConfigHostReads(t *testing.T) {
	for doc, off := range map[string]bool{`{}`: false, `{"host_reads": true}`: false, `{"host_reads": false}`: true} {
		c, err := ParseConfig([]byte(doc))
		if err != nil || c.NoHostReads != off {
			t.Errorf("ParseConfig(%s): NoHostReads %v, %v; want %v", doc, c.NoHostReads, err, off)
		}
	}
	if _, err := ParseConfig([]byte(`{"host_reads": "no"}`)); err == nil || !strings.Contains(err.Error(), "host_reads") {
		t.Errorf(`ParseConfig({"host_reads": "no"}): %v, want an error naming host_reads`, err)
	}
}

func TestParseConfigUnknownKeys(t *testing.T) {
	for _, tc := range []struct {
		doc      string
		contains []string
	}{
		{`{"capacty": 5}`, []string{"capacty", "known keys", "capacity", "servers", "prefix", "expiry", "channel_capacity", "group_expiry", "mailbox_grace", "release_linger", "connect_deadline", "publish_deadline", "host_reads", "connect_options"}},
		{`{"servers": "nats://a:4222", "hosts": ["x"]}`, []string{"hosts", "known keys", "capacity", "servers"}},
		{`{"connect_options": {"tokn": "x"}}`, []string{"connect_options", "tokn", "known keys", "token", "user", "password", "creds", "nkey_seed", "tls_cert", "tls_key", "tls_ca", "tls_handshake_first", "dont_randomize", "reconnect_time_wait", "max_reconnect_attempts", "pending_size", "connect_timeout", "drain_timeout", "flush_timeout", "pending_msgs_limit", "ping_interval", "max_pings_outstanding", "name"}},
		// The option pending_size replaced is refused by name, not silently ignored.
		{`{"connect_options": {"reconnect_buffer_size": 1048576}}`, []string{"reconnect_buffer_size", "known keys", "pending_size"}},
	} {
		_, err := ParseConfig([]byte(tc.doc))
		if err == nil {
			t.Errorf("ParseConfig(%s) accepted an unknown key", tc.doc)
			continue
		}
		for _, s := range tc.contains {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("ParseConfig(%s) error %q does not contain %q", tc.doc, err, s)
			}
		}
	}
	// The connect_options keys are not offered for a top-level mistake, nor the reverse.
	_, err := ParseConfig([]byte(`{"bogus": 1}`))
	if err == nil || strings.Contains(err.Error(), "pending_msgs_limit") {
		t.Errorf("top-level unknown key error %v lists connect_options keys", err)
	}
	_, err = ParseConfig([]byte(`{"connect_options": {"bogus": 1}}`))
	if err == nil || strings.Contains(err.Error(), "group_expiry") {
		t.Errorf("connect_options unknown key error %v lists top-level keys", err)
	}
}

func TestParseConfigWrongTypes(t *testing.T) {
	for _, doc := range []string{
		``,
		`[]`,
		`"x"`,
		`{"capacity": "100"}`,
		`{"capacity": 1.5}`,
		`{"prefix": 5}`,
		`{"expiry": "60"}`,
		`{"expiry": true}`,
		`{"servers": 5}`,
		`{"servers": [1, 2]}`,
		`{"servers": {"a": "b"}}`,
		`{"channel_capacity": 5}`,
		`{"channel_capacity": "x"}`,
		`{"channel_capacity": {"a*": "big"}}`,
		`{"channel_capacity": {"a*": 1.5}}`,
		`{"connect_options": 5}`,
		`{"connect_options": {"dont_randomize": "yes"}}`,
		`{"connect_options": {"max_reconnect_attempts": "5"}}`,
		`{"connect_options": {"connect_timeout": "2"}}`,
		`{"connect_options": {"pending_msgs_limit": 1.5}}`,
		`{"connect_options": {"token": 5}}`,
		`{"capacity": 5} {"capacity": 6}`,
		`{"capacity": 5`,
	} {
		if c, err := ParseConfig([]byte(doc)); err == nil {
			t.Errorf("ParseConfig(%s) = %+v, want an error", doc, c)
		}
	}
}

func TestParseConfigChannelCapacityOrder(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want map[string]int
	}{
		{`{"capacity": 9, "channel_capacity": {"specific.*": 2, "*": 5}}`,
			map[string]int{"specific.x!y": 2, "specific.abc": 2, "other": 5, "http.request": 5}},
		// The same rules in the other order: "*" now matches everything first.
		{`{"capacity": 9, "channel_capacity": {"*": 5, "specific.*": 2}}`,
			map[string]int{"specific.x!y": 5, "other": 5}},
		// Many entries keep their order (no map iteration in between).
		{`{"channel_capacity": {"a1": 1, "a2": 2, "a3": 3, "a?": 4, "b*": 5, "a[0-9]": 6, "c": 7}}`,
			map[string]int{"a1": 1, "a2": 2, "a3": 3, "a4": 4, "ab": 4, "bx": 5, "c": 7, "cc": DefaultCapacity}},
		{`{"capacity": 3, "channel_capacity": {}}`, map[string]int{"x": 3}},
		{`{"capacity": 3, "channel_capacity": null}`, map[string]int{"x": 3}},
	} {
		c, err := ParseConfig([]byte(tc.doc))
		if err != nil {
			t.Errorf("ParseConfig(%s): %v", tc.doc, err)
			continue
		}
		d, err := c.WithDefaults()
		if err != nil {
			t.Errorf("WithDefaults(%s): %v", tc.doc, err)
			continue
		}
		for name, want := range tc.want {
			if got := d.capacityOf(name); got != want {
				t.Errorf("%s: capacityOf(%q) = %d, want %d", tc.doc, name, got, want)
			}
		}
	}
}

func TestParseConfigChannelCapacityList(t *testing.T) {
	doc := `{"channel_capacity": [
		{"regex": "http\\.request", "capacity": 200},
		{"pattern": "a?", "capacity": 3},
		{"regex": "^ws|^wss", "capacity": 7},
		{"regex": "specific\\..*!$", "capacity": 9}
	]}`
	c, err := ParseConfig([]byte(doc))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	want := []CapacityRule{
		{Regex: `http\.request`, Capacity: 200}, {Pattern: "a?", Capacity: 3},
		{Regex: "^ws|^wss", Capacity: 7}, {Regex: `specific\..*!$`, Capacity: 9},
	}
	if len(c.ChannelCapacity) != len(want) {
		t.Fatalf("rules = %+v, want %+v", c.ChannelCapacity, want)
	}
	for i, r := range c.ChannelCapacity {
		if r.Pattern != want[i].Pattern || r.Regex != want[i].Regex || r.Capacity != want[i].Capacity {
			t.Errorf("rule %d = %+v, want %+v", i, r, want[i])
		}
	}
	d, err := c.WithDefaults()
	if err != nil {
		t.Fatalf("WithDefaults: %v", err)
	}
	for name, want := range map[string]int{
		"http.request":      200,
		"http.request.body": 200, // a regex matches at the start, like re.match
		"http.requestX":     200,
		"xhttp.request":     DefaultCapacity,
		"httpXrequest":      DefaultCapacity,
		"ab":                3,
		"abc":               DefaultCapacity, // a glob matches the whole name
		"ws.connect":        7,
		"websocket":         DefaultCapacity,
		"xws":               DefaultCapacity, // the alternation stays anchored
		"wss.x":             7,
		"specific.ab!":      9,
		"specific.ab!cd":    DefaultCapacity,
	} {
		if got := d.capacityOf(name); got != want {
			t.Errorf("capacityOf(%q) = %d, want %d", name, got, want)
		}
	}
}

func TestParseConfigMaxReconnects(t *testing.T) {
	for _, tc := range []struct {
		doc         string
		parsed, def int
	}{
		{`{"connect_options": {"max_reconnect_attempts": 0}}`, NoReconnect, NoReconnect},
		{`{"connect_options": {"max_reconnect_attempts": 5}}`, 5, 5},
		{`{"connect_options": {"max_reconnect_attempts": -1}}`, -1, -1},
		{`{"connect_options": {"max_reconnect_attempts": null}}`, 0, -1},
		{`{"connect_options": {"name": "x"}}`, 0, -1},
		{`{"connect_options": null}`, 0, -1},
		{`{}`, 0, -1},
	} {
		c, err := ParseConfig([]byte(tc.doc))
		if err != nil {
			t.Errorf("ParseConfig(%s): %v", tc.doc, err)
			continue
		}
		if c.Connection.MaxReconnects != tc.parsed {
			t.Errorf("ParseConfig(%s).MaxReconnects = %d, want %d", tc.doc, c.Connection.MaxReconnects, tc.parsed)
		}
		d, err := c.WithDefaults()
		if err != nil {
			t.Errorf("WithDefaults(%s): %v", tc.doc, err)
			continue
		}
		if d.Connection.MaxReconnects != tc.def {
			t.Errorf("%s: MaxReconnects after WithDefaults = %d, want %d", tc.doc, d.Connection.MaxReconnects, tc.def)
		}
	}
	c, _ := ParseConfig([]byte(`{"connect_options": {"max_reconnect_attempts": -5}}`))
	if _, err := c.WithDefaults(); err == nil {
		t.Error("max_reconnect_attempts -5 was accepted")
	}
}

func TestWithDefaults(t *testing.T) {
	d, err := Config{}.WithDefaults()
	if err != nil {
		t.Fatalf("WithDefaults: %v", err)
	}
	log := d.Log
	d.Log = nil
	want := Config{
		Servers: []string{DefaultServer}, Prefix: DefaultPrefix, Expiry: DefaultExpiry, Capacity: DefaultCapacity,
		GroupExpiry: DefaultGroupExpiry, MailboxGrace: DefaultMailboxGrace, ReleaseLinger: DefaultReleaseLinger,
		ConnectDeadline: DefaultConnectDeadline, PublishDeadline: DefaultPublishDeadline,
		Connection: ConnectionOptions{
			ReconnectWait: DefaultReconnectWait, MaxReconnects: -1, PendingSize: DefaultPendingSize,
			ConnectTimeout: DefaultConnectTimeout, DrainTimeout: DefaultDrainTimeout,
			FlushTimeout: DefaultFlushTimeout, PendingMsgsLimit: DefaultPendingMsgsLimit,
			PingInterval: DefaultPingInterval, MaxPingsOutstanding: DefaultMaxPingsOut,
		},
	}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("WithDefaults:\n got %+v\nwant %+v", d, want)
	}
	if log == nil {
		t.Error("WithDefaults left Log nil")
	}
	// The documented values of the defaults (SPEC S4, S5, S6, S16, S18, section 3).
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"DefaultServer", DefaultServer, "nats://127.0.0.1:4222"},
		{"DefaultPrefix", DefaultPrefix, "channels"},
		{"DefaultExpiry", DefaultExpiry, 60 * time.Second},
		{"DefaultCapacity", DefaultCapacity, 100},
		{"DefaultGroupExpiry", DefaultGroupExpiry, 86400 * time.Second},
		{"DefaultMailboxGrace", DefaultMailboxGrace, 60 * time.Second},
		{"DefaultReleaseLinger", DefaultReleaseLinger, 300 * time.Millisecond},
		{"DefaultDrainTimeout", DefaultDrainTimeout, 2 * time.Second},
		{"DefaultConnectDeadline", DefaultConnectDeadline, 5 * time.Second},
		{"DefaultPublishDeadline", DefaultPublishDeadline, 10 * time.Second},
		{"DefaultPendingSize", DefaultPendingSize, 2 * 1024 * 1024},
		{"DefaultPingInterval", DefaultPingInterval, 4 * time.Second},
		{"DefaultMaxPingsOut", DefaultMaxPingsOut, 2},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}

	// Set fields are kept.
	var logged []string
	set := Config{
		Servers: []string{"nats://x:1"}, Prefix: "p", Expiry: time.Second, Capacity: 1, GroupExpiry: 2 * time.Second,
		MailboxGrace: 3 * time.Second, ReleaseLinger: time.Millisecond, ConnectDeadline: 10 * time.Second,
		PublishDeadline: 11 * time.Second,
		Connection: ConnectionOptions{ReconnectWait: 4 * time.Second, MaxReconnects: 3, PendingSize: 5,
			ConnectTimeout: 6 * time.Second, DrainTimeout: 7 * time.Second, FlushTimeout: 8 * time.Second, PendingMsgsLimit: 9,
			PingInterval: 12 * time.Second, MaxPingsOutstanding: 13},
		Log: func(_ Level, m string) { logged = append(logged, m) },
	}
	got, err := set.WithDefaults()
	if err != nil {
		t.Fatalf("WithDefaults: %v", err)
	}
	got.Log(LevelInfo, "hello")
	got.Log, set.Log = nil, nil
	if !reflect.DeepEqual(got, set) {
		t.Errorf("WithDefaults changed set fields:\n got %+v\nwant %+v", got, set)
	}
	if len(logged) != 1 || logged[0] != "hello" {
		t.Errorf("WithDefaults replaced the Log function: %q", logged)
	}
}

func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		c        Config
		contains string
	}{
		{"negative expiry", Config{Expiry: -time.Second}, "expiry"},
		{"negative group_expiry", Config{GroupExpiry: -1}, "group_expiry"},
		{"negative mailbox_grace", Config{MailboxGrace: -1}, "mailbox_grace"},
		{"negative release_linger", Config{ReleaseLinger: -1}, "release_linger"},
		{"negative connect_timeout", Config{Connection: ConnectionOptions{ConnectTimeout: -1}}, "connect_timeout"},
		{"negative drain_timeout", Config{Connection: ConnectionOptions{DrainTimeout: -1}}, "drain_timeout"},
		{"negative flush_timeout", Config{Connection: ConnectionOptions{FlushTimeout: -1}}, "flush_timeout"},
		{"negative reconnect_wait", Config{Connection: ConnectionOptions{ReconnectWait: -1}}, "reconnect_wait"},
		{"negative capacity", Config{Capacity: -1}, "capacity"},
		{"negative pending limit", Config{Connection: ConnectionOptions{PendingMsgsLimit: -1}}, "pending_msgs_limit"},
		{"negative pending_size", Config{Connection: ConnectionOptions{PendingSize: -1}}, "pending_size"},
		{"negative connect_deadline", Config{ConnectDeadline: -1}, "connect_deadline"},
		{"negative publish_deadline", Config{PublishDeadline: -1}, "publish_deadline"},
		{"negative ping_interval", Config{Connection: ConnectionOptions{PingInterval: -1}}, "ping_interval"},
		{"negative max_pings_outstanding", Config{Connection: ConnectionOptions{MaxPingsOutstanding: -1}}, "max_pings_outstanding"},
		{"max reconnects below NoReconnect", Config{Connection: ConnectionOptions{MaxReconnects: -3}}, "max_reconnect_attempts"},
		{"bad prefix", Config{Prefix: "a..b"}, "a..b"},
		{"prefix with a space", Config{Prefix: "my app"}, "my app"},
		{"prefix with a wildcard", Config{Prefix: "app.>"}, "app.>"},
		{"empty server", Config{Servers: []string{"nats://a:1", " "}}, "servers"},
		{"tls_cert without tls_key", Config{Connection: ConnectionOptions{TLSCertFile: "c.pem"}}, "tls_key"},
		{"tls_key without tls_cert", Config{Connection: ConnectionOptions{TLSKeyFile: "k.pem"}}, "tls_cert"},
		{"capacity rule of 0", Config{ChannelCapacity: []CapacityRule{{Pattern: "a*", Capacity: 0}}}, "at least 1"},
		{"negative capacity rule", Config{ChannelCapacity: []CapacityRule{{Pattern: "a*", Capacity: -2}}}, "a*"},
		{"pattern and regex", Config{ChannelCapacity: []CapacityRule{{Pattern: "a*", Regex: "a", Capacity: 1}}}, "exactly one"},
		{"neither pattern nor regex", Config{ChannelCapacity: []CapacityRule{{Capacity: 1}}}, "exactly one"},
		{"invalid regex", Config{ChannelCapacity: []CapacityRule{{Regex: "(", Capacity: 1}}}, "channel_capacity"},
		{"invalid regex after a valid rule", Config{ChannelCapacity: []CapacityRule{{Pattern: "x", Capacity: 1}, {Regex: "a[", Capacity: 1}}}, "channel_capacity"},
	} {
		_, err := tc.c.WithDefaults()
		if err == nil {
			t.Errorf("%s: WithDefaults accepted %+v", tc.desc, tc.c)
			continue
		}
		if !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: error %q does not contain %q", tc.desc, err, tc.contains)
		}
	}
	// A bad prefix is reported as a *NameError, like bad channel names.
	_, err := Config{Prefix: "a..b"}.WithDefaults()
	var ne *NameError
	if !errors.As(err, &ne) || ne.Kind != "prefix" {
		t.Errorf("bad prefix error %v is not a prefix *NameError", err)
	}
	// Errors found while parsing a document come out of WithDefaults as well.
	c, err := ParseConfig([]byte(`{"channel_capacity": [{"pattern": "a", "regex": "b", "capacity": 1}]}`))
	if err == nil {
		_, err = c.WithDefaults()
	}
	if err == nil {
		t.Error("a rule with both pattern and regex was accepted")
	}
	c, err = ParseConfig([]byte(`{"connect_options": {"tls_cert": "c.pem"}}`))
	if err == nil {
		_, err = c.WithDefaults()
	}
	if err == nil {
		t.Error("tls_cert without tls_key was accepted")
	}
	c, err = ParseConfig([]byte(`{"expiry": -1}`))
	if err == nil {
		_, err = c.WithDefaults()
	}
	if err == nil {
		t.Error("a negative expiry was accepted")
	}
}

// globMatch compiles globToRegexp(pattern) and matches name with it.
func globMatch(t *testing.T, pattern, name string) bool {
	t.Helper()
	re, err := regexp.Compile(globToRegexp(pattern))
	if err != nil {
		t.Errorf("glob %q: translation %q does not compile: %v", pattern, globToRegexp(pattern), err)
		return false
	}
	return re.MatchString(name)
}

func TestGlobToRegexp(t *testing.T) {
	// Expected results are Python's fnmatch.fnmatchcase(name, pattern).
	for _, tc := range []struct {
		pattern, name string
		want          bool
	}{
		{"*", "a.b!c", true},
		{"*", "", true},
		{"*", "line\nbreak", true},
		{"specific.*", "specific.x!y", true},
		{"specific.*", "specificx", false},
		{"specific.*", "xspecific.a", false},
		{"specific.?", "specific.a", true},
		{"specific.?", "specific.", false},
		{"specific.?", "specific.ab", false},
		{"?", "\n", true},
		{"?", "é", true},
		{"[abc]x", "ax", true},
		{"[abc]x", "cx", true},
		{"[abc]x", "dx", false},
		{"[abc]x", "abx", false},
		{"[!abc]x", "dx", true},
		{"[!abc]x", "ax", false},
		{"[a-c]x", "bx", true},
		{"[a-c]x", "dx", false},
		{"[", "[", true},
		{"[a", "[a", true},
		{"[a", "a", false},
		{"a[b", "a[b", true},
		{"a.b", "a.b", true},
		{"a.b", "axb", false},
		{"a+", "a+", true},
		{"a+", "aa", false},
		{"a|b", "a", false},
		{"a|b", "a|b", true},
		{"(a)", "(a)", true},
		{"a{2}", "aa", false},
		{"a{2}", "a{2}", true},
		{"$x^", "$x^", true},
		{`a\b`, `a\b`, true},
		{"]", "]", true},
		{"[]abc]", "]", true},
		{"[]abc]", "d", false},
		{"[.]", ".", true},
		{"[.]", "x", false},
		{"http.request*", "http.request", true},
		{"http.request*", "http.request.body", true},
		{"http.request*", "http.requests", true},
		{"http.request*", "xhttp.request", false},
		{"안*", "안녕", true},
		{"[안]x", "안x", true},
		// fnmatch escapes a leading '^' in a set: it is a member, not a negation.
		{"[^a]", "^", true},
		{"[^a]", "a", true},
		{"[^a]", "b", false},
		// "[!]...]": a ']' right after "[!" is a member of the negated set.
		{"[!]abc]", "x", true},
		{"[!]abc]", "]", false},
		{"[!]abc]", "a", false},
		// "[]" and "[!]" have no closing bracket of their own, so they are literal.
		{"[]", "[]", true},
		{"[!]", "[!]", true},
		{"x[!]", "x[!]", true},
	} {
		if got := globMatch(t, tc.pattern, tc.name); got != tc.want {
			t.Errorf("glob %q on %q = %v, want %v (translation %q)", tc.pattern, tc.name, got, tc.want, globToRegexp(tc.pattern))
		}
	}
}
