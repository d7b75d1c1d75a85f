package layer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Config configures a Layer. The zero value of every field means "use the default"; Connect
// fills the defaults in (see WithDefaults).
type Config struct {
	// Servers are the NATS URLs to connect to (default nats://127.0.0.1:4222). Credentials in
	// URLs are accepted and never appear in logs or error texts.
	Servers []string
	// Prefix is the first subject token of every subject the layer uses (default "channels").
	// Several applications can share one NATS server with different prefixes.
	Prefix string
	// Expiry is how long a message may wait in a local mailbox before it is dropped (default 60 s).
	// The clock starts when the message reaches this process.
	Expiry time.Duration
	// Capacity is how many messages one mailbox holds (default 100). New messages to a full
	// mailbox are dropped and counted; nothing ever blocks or raises ChannelFull.
	Capacity int
	// ChannelCapacity overrides Capacity for matching channel names; the first match wins.
	ChannelCapacity []CapacityRule
	// GroupExpiry is how long a member channel may go unread before it leaves its groups
	// (default 86400 s).
	GroupExpiry time.Duration
	// MailboxGrace is how long an idle mailbox (no reader, no traffic, no group) is kept before
	// it is reclaimed (default 60 s).
	MailboxGrace time.Duration
	// ReleaseLinger is how long a plain channel keeps its subscription after its last reader
	// was cancelled, so back-to-back polls do not drop their queue-group share (default 300 ms).
	ReleaseLinger time.Duration
	// ConnectDeadline bounds the first connect, retries included (default 5 s, as the nats-py
	// layer's connect_deadline).
	ConnectDeadline time.Duration
	// PublishDeadline is how long a send may wait for room in the outbound buffer before it
	// fails with *PublishTimeoutError (default 10 s, as the nats-py layer's publish_deadline).
	PublishDeadline time.Duration
	// NoHostReads keeps the host from reading the connection: ReadEvents then returns
	// ErrNoReadEvents, and the library's own thread reads as it does over TLS (configuration key
	// host_reads: false). A switch for a host whose event loop should never run the library's
	// reads, or to rule that path out when looking into a problem.
	NoHostReads bool
	// Connection holds the NATS connection options.
	Connection ConnectionOptions
	// Log receives the layer's warnings (drops, reconnects). Default: the log/slog default logger.
	Log LogFunc
	// Deliveries, when set, is called by the layer's routing around the deliveries one arrived message
	// makes to waiting receives (a group message wakes every waiting member): Deliveries(true)
	// before the first, Deliveries(false) after the last. A host that wakes an event loop per
	// result can wake it once for the whole burst instead. A group of more than 256 members gets
	// its message in chunks of 256, so that the first members need not wait for the last: each
	// chunk is a burst of its own.
	Deliveries func(begin bool)
}

// ConnectionOptions are passed to nats.go. Zero values select the defaults documented per field.
type ConnectionOptions struct {
	Name          string // connection name shown by the server's monitoring
	Token         string
	User          string
	Password      string
	CredsFile     string // a .creds file (JWT and nkey seed)
	NkeySeedFile  string // a file holding an nkey seed
	TLSCertFile   string // client certificate (with TLSKeyFile) for mutual TLS
	TLSKeyFile    string
	TLSCAFile     string // CA bundle that signs the server certificate
	TLSFirst      bool   // TLS handshake before the server's INFO (server option handshake_first)
	NoRandomize   bool   // try Servers in the given order
	ReconnectWait time.Duration
	// MaxReconnects is how many reconnect attempts nats.go makes before closing the connection
	// for good; -1 (the default) means forever, NoReconnect means none. After a close for good
	// the layer opens a new connection itself and restores every subscription.
	MaxReconnects int
	// PendingSize bounds the bytes of accepted publishes not yet written to the connection,
	// during an outage or a stall too (default 2 MiB). A send that finds no room waits for it
	// (backpressure), up to PublishDeadline.
	PendingSize    int
	ConnectTimeout time.Duration // per server (default 2 s)
	DrainTimeout   time.Duration // bound of Close's drain (default 2 s)
	FlushTimeout   time.Duration // bound of a subscription confirmation round trip (default 5 s)
	// PingInterval is how often the client pings the server; MaxPingsOutstanding how many may
	// go unanswered before the connection counts as dead and is replaced (defaults 4 s and 2: a
	// dead link is noticed within 12 s). A write to the socket that takes nothing for
	// PingInterval x (MaxPingsOutstanding+1) ends the connection too.
	PingInterval        time.Duration
	MaxPingsOutstanding int
	// PendingMsgsLimit is how many inbound messages may wait to be routed before the connection
	// drops new ones as a slow consumer (default 65536).
	PendingMsgsLimit int
}

// CapacityRule sets the capacity of the channels whose name matches Pattern, a shell glob as
// Python's fnmatch reads it (*, ?, [seq], [!seq]), or Regex, a regular expression matched at the
// start of the name (like Python's re.match).
type CapacityRule struct {
	Pattern  string
	Regex    string
	Capacity int

	compiled *regexp.Regexp
}

// Defaults.
const (
	DefaultServer           = "nats://127.0.0.1:4222"
	DefaultPrefix           = "channels"
	DefaultExpiry           = 60 * time.Second
	DefaultCapacity         = 100
	DefaultGroupExpiry      = 86400 * time.Second
	DefaultMailboxGrace     = 60 * time.Second
	DefaultReleaseLinger    = 300 * time.Millisecond
	DefaultConnectDeadline  = 5 * time.Second
	DefaultPublishDeadline  = 10 * time.Second
	DefaultReconnectWait    = time.Second
	DefaultConnectTimeout   = 2 * time.Second
	DefaultDrainTimeout     = 2 * time.Second
	DefaultFlushTimeout     = 5 * time.Second
	DefaultPendingMsgsLimit = 65536
	DefaultPendingSize      = 2 * 1024 * 1024
	DefaultPingInterval     = 4 * time.Second
	DefaultMaxPingsOut      = 2
)

// WithDefaults returns c with every unset field set to its default, and checks it.
func (c Config) WithDefaults() (Config, error) {
	if len(c.Servers) == 0 {
		c.Servers = []string{DefaultServer}
	}
	setDefault(&c.Prefix, DefaultPrefix)
	setDefault(&c.Expiry, DefaultExpiry)
	setDefault(&c.Capacity, DefaultCapacity)
	setDefault(&c.GroupExpiry, DefaultGroupExpiry)
	setDefault(&c.MailboxGrace, DefaultMailboxGrace)
	setDefault(&c.ReleaseLinger, DefaultReleaseLinger)
	setDefault(&c.ConnectDeadline, DefaultConnectDeadline)
	setDefault(&c.PublishDeadline, DefaultPublishDeadline)
	o := &c.Connection
	setDefault(&o.ReconnectWait, DefaultReconnectWait)
	setDefault(&o.MaxReconnects, -1)
	setDefault(&o.PendingSize, DefaultPendingSize)
	setDefault(&o.PingInterval, DefaultPingInterval)
	setDefault(&o.MaxPingsOutstanding, DefaultMaxPingsOut)
	setDefault(&o.ConnectTimeout, DefaultConnectTimeout)
	setDefault(&o.DrainTimeout, DefaultDrainTimeout)
	setDefault(&o.FlushTimeout, DefaultFlushTimeout)
	setDefault(&o.PendingMsgsLimit, DefaultPendingMsgsLimit)
	if c.Log == nil {
		c.Log = slogLog
	}
	return c, c.check()
}

func setDefault[T comparable](field *T, value T) {
	var zero T
	if *field == zero {
		*field = value
	}
}

func (c *Config) check() error {
	if err := validatePrefix(c.Prefix); err != nil {
		return err
	}
	for _, s := range c.Servers {
		if strings.TrimSpace(s) == "" {
			return errors.New("config: servers: an empty server URL")
		}
	}
	positive := map[string]time.Duration{
		"expiry": c.Expiry, "group_expiry": c.GroupExpiry, "mailbox_grace": c.MailboxGrace,
		"release_linger": c.ReleaseLinger, "connect_timeout": c.Connection.ConnectTimeout,
		"drain_timeout": c.Connection.DrainTimeout, "flush_timeout": c.Connection.FlushTimeout,
		"reconnect_wait": c.Connection.ReconnectWait, "connect_deadline": c.ConnectDeadline,
		"publish_deadline": c.PublishDeadline, "ping_interval": c.Connection.PingInterval,
	}
	for name, d := range positive {
		if d < 0 {
			return fmt.Errorf("config: %s must not be negative", name)
		}
	}
	if c.Capacity < 0 || c.Connection.PendingMsgsLimit < 0 || c.Connection.PendingSize < 0 || c.Connection.MaxPingsOutstanding < 0 {
		return errors.New("config: capacity, pending_msgs_limit, pending_size and max_pings_outstanding must not be negative")
	}
	if c.Connection.MaxReconnects < NoReconnect {
		return errors.New("config: max_reconnect_attempts must be -1 (forever) or more")
	}
	if (c.Connection.TLSCertFile == "") != (c.Connection.TLSKeyFile == "") {
		return errors.New("config: tls_cert and tls_key go together")
	}
	for i := range c.ChannelCapacity {
		if err := c.ChannelCapacity[i].compile(); err != nil {
			return err
		}
	}
	return nil
}

func (r *CapacityRule) compile() error {
	if (r.Pattern == "") == (r.Regex == "") {
		return errors.New("config: channel_capacity: each rule needs exactly one of a pattern or a regex")
	}
	if r.Capacity < 1 {
		return fmt.Errorf("config: channel_capacity: capacity for %q must be at least 1", r.Pattern+r.Regex)
	}
	expr := `^(?:` + r.Regex + `)`
	if r.Pattern != "" {
		expr = globToRegexp(r.Pattern)
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return fmt.Errorf("config: channel_capacity: %w", err)
	}
	r.compiled = re
	return nil
}

// globToRegexp translates a pattern the way Python's fnmatch.translate does, so the same
// channel_capacity setting means the same in every host language.
func globToRegexp(glob string) string {
	pat := []rune(glob)
	var b strings.Builder
	b.WriteString(`^(?s:`)
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; c {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		case '[':
			// As fnmatch: "!" negates, a "]" right after "[" or "[!" is a member, and a "["
			// without its "]" is a literal.
			j := i + 1
			if j < len(pat) && pat[j] == '!' {
				j++
			}
			if j < len(pat) && pat[j] == ']' {
				j++
			}
			for j < len(pat) && pat[j] != ']' {
				j++
			}
			if j >= len(pat) {
				b.WriteString(`\[`)
				continue
			}
			writeClass(&b, pat[i+1:j])
			i = j
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString(`)$`)
	return b.String()
}

// writeClass writes the members of a glob "[...]" set as a regexp class.
func writeClass(b *strings.Builder, set []rune) {
	switch {
	case len(set) == 0:
		b.WriteString(`[^\x00-\x{10FFFF}]`) // "[]" never matches, as in fnmatch
		return
	case len(set) == 1 && set[0] == '!':
		b.WriteString(`.`)
		return
	}
	b.WriteByte('[')
	if set[0] == '!' {
		b.WriteByte('^')
		set = set[1:]
	}
	for _, r := range set {
		// Escape every punctuation rune but "-", which keeps its range meaning.
		if r != '-' && r < utf8.RuneSelf && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte(']')
}

// capacityOf returns the capacity of the mailbox for channel name.
func (c *Config) capacityOf(name string) int {
	for _, r := range c.ChannelCapacity {
		if r.compiled.MatchString(name) {
			return r.Capacity
		}
	}
	return c.Capacity
}

// ParseConfig reads a configuration document: the JSON form of a Django CHANNEL_LAYERS CONFIG
// block. Durations are seconds. An unknown key is an error that lists the known ones.
//
//	{"servers": ["nats://127.0.0.1:4222"], "prefix": "channels", "expiry": 60, "capacity": 100,
//	 "channel_capacity": {"http.request*": 200}, "group_expiry": 86400, "mailbox_grace": 60,
//	 "release_linger": 0.3, "connect_deadline": 5, "publish_deadline": 10, "host_reads": true,
//	 "connect_options": {"name": "web", "token": "s3cret"}}
func ParseConfig(doc []byte) (Config, error) {
	var raw struct {
		Servers         json.RawMessage `json:"servers"`
		Prefix          string          `json:"prefix"`
		Expiry          seconds         `json:"expiry"`
		Capacity        int             `json:"capacity"`
		ChannelCapacity json.RawMessage `json:"channel_capacity"`
		GroupExpiry     seconds         `json:"group_expiry"`
		MailboxGrace    seconds         `json:"mailbox_grace"`
		ReleaseLinger   seconds         `json:"release_linger"`
		ConnectDeadline seconds         `json:"connect_deadline"`
		PublishDeadline seconds         `json:"publish_deadline"`
		HostReads       *bool           `json:"host_reads"`
		ConnectOptions  json.RawMessage `json:"connect_options"`
	}
	if err := decodeStrict(doc, &raw, "config"); err != nil {
		return Config{}, err
	}
	c := Config{
		Prefix: raw.Prefix, Expiry: time.Duration(raw.Expiry), Capacity: raw.Capacity,
		GroupExpiry: time.Duration(raw.GroupExpiry), MailboxGrace: time.Duration(raw.MailboxGrace),
		ReleaseLinger: time.Duration(raw.ReleaseLinger), ConnectDeadline: time.Duration(raw.ConnectDeadline),
		PublishDeadline: time.Duration(raw.PublishDeadline),
		NoHostReads:     raw.HostReads != nil && !*raw.HostReads,
	}
	var err error
	if c.Servers, err = parseServers(raw.Servers); err != nil {
		return Config{}, err
	}
	if c.ChannelCapacity, err = parseCapacityRules(raw.ChannelCapacity); err != nil {
		return Config{}, err
	}
	if len(raw.ConnectOptions) > 0 && string(raw.ConnectOptions) != "null" {
		var o struct {
			Name                string  `json:"name"`
			Token               string  `json:"token"`
			User                string  `json:"user"`
			Password            string  `json:"password"`
			Creds               string  `json:"creds"`
			NkeySeed            string  `json:"nkey_seed"`
			TLSCert             string  `json:"tls_cert"`
			TLSKey              string  `json:"tls_key"`
			TLSCA               string  `json:"tls_ca"`
			TLSFirst            bool    `json:"tls_handshake_first"`
			DontRandomize       bool    `json:"dont_randomize"`
			ReconnectWait       seconds `json:"reconnect_time_wait"`
			MaxReconnects       *int    `json:"max_reconnect_attempts"`
			PendingSize         int     `json:"pending_size"`
			ConnectTimeout      seconds `json:"connect_timeout"`
			DrainTimeout        seconds `json:"drain_timeout"`
			FlushTimeout        seconds `json:"flush_timeout"`
			PendingMsgsLimit    int     `json:"pending_msgs_limit"`
			PingInterval        seconds `json:"ping_interval"`
			MaxPingsOutstanding int     `json:"max_pings_outstanding"`
		}
		if err := decodeStrict(raw.ConnectOptions, &o, "connect_options"); err != nil {
			return Config{}, err
		}
		c.Connection = ConnectionOptions{
			Name: o.Name, Token: o.Token, User: o.User, Password: o.Password, CredsFile: o.Creds,
			NkeySeedFile: o.NkeySeed, TLSCertFile: o.TLSCert, TLSKeyFile: o.TLSKey, TLSCAFile: o.TLSCA,
			TLSFirst: o.TLSFirst, NoRandomize: o.DontRandomize, ReconnectWait: time.Duration(o.ReconnectWait),
			PendingSize: o.PendingSize, ConnectTimeout: time.Duration(o.ConnectTimeout),
			DrainTimeout: time.Duration(o.DrainTimeout), FlushTimeout: time.Duration(o.FlushTimeout),
			PendingMsgsLimit: o.PendingMsgsLimit, PingInterval: time.Duration(o.PingInterval),
			MaxPingsOutstanding: o.MaxPingsOutstanding,
		}
		if o.MaxReconnects != nil {
			c.Connection.MaxReconnects = *o.MaxReconnects
			if *o.MaxReconnects == 0 {
				// 0 means "never reconnect" here, distinct from "unset"; nats.go reads 0 the same way.
				c.Connection.MaxReconnects = NoReconnect
			}
		}
	}
	return c, nil
}

// NoReconnect is the MaxReconnects value for "close the connection at the first loss" (0 means
// "unset" in a Config). The layer then opens a new connection itself, as after any close for good.
const NoReconnect = -2

// seconds reads a JSON number of seconds.
type seconds time.Duration

func (s *seconds) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return errors.New("a duration must be a number of seconds")
	}
	if math.IsNaN(f) || math.Abs(f) > float64(math.MaxInt64)/float64(time.Second) {
		return errors.New("a duration must be a number of seconds below 292 years")
	}
	*s = seconds(math.Round(f * float64(time.Second)))
	return nil
}

// decodeStrict decodes one JSON object and names the known keys when it meets an unknown one.
func decodeStrict(doc []byte, into any, what string) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return fmt.Errorf("%s: unknown key %s; known keys: %s", what, field, strings.Join(jsonKeys(into), ", "))
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if dec.More() {
		return fmt.Errorf("%s: more than one JSON value", what)
	}
	return nil
}

// jsonKeys lists the JSON keys of a struct, sorted.
func jsonKeys(v any) []string {
	b, _ := json.Marshal(v)
	var m map[string]json.RawMessage
	_ = json.Unmarshal(b, &m)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func parseServers(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return splitServers(one), nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errors.New("config: servers must be a string or a list of strings")
	}
	return many, nil
}

// splitServers accepts "nats://a:4222,nats://b:4222" as nats.go and nats-py do.
func splitServers(s string) []string {
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// parseCapacityRules reads channel_capacity as a JSON object {"glob": capacity, ...} (in document
// order, first match wins) or as a list of {"pattern"|"regex": ..., "capacity": n}.
func parseCapacityRules(raw json.RawMessage) ([]CapacityRule, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []struct {
		Pattern  string `json:"pattern"`
		Regex    string `json:"regex"`
		Capacity int    `json:"capacity"`
	}
	if err := json.Unmarshal(raw, &list); err == nil {
		rules := make([]CapacityRule, len(list))
		for i, r := range list {
			rules[i] = CapacityRule{Pattern: r.Pattern, Regex: r.Regex, Capacity: r.Capacity}
		}
		return rules, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("config: channel_capacity must be an object of pattern: capacity or a list of rules")
	}
	var rules []CapacityRule
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("config: channel_capacity: %w", err)
		}
		var capacity int
		if err := dec.Decode(&capacity); err != nil {
			return nil, fmt.Errorf("config: channel_capacity: the capacity of %q must be an integer", tok)
		}
		rules = append(rules, CapacityRule{Pattern: tok.(string), Capacity: capacity})
	}
	return rules, nil
}
