package layer

import (
	"errors"
	"net/url"
	"regexp"
	"sort"
	"strings"
)

// redactor keeps credentials out of every text the layer writes: log records and error texts.
// It removes the exact secrets of its configuration, in every form nats.go accepts them (the user
// information of each server URL, with or without a scheme, escaped or not, with spaces, '/' or
// '@' in it; the token and password options), and the user information of any other URL.
type redactor struct {
	secrets *strings.Replacer // nil: no secret configured
}

// redacted stands where a secret was.
const redacted = "[redacted]"

// userInfo matches the user information of a URL ("nats://user:password@" or "nats://token@"),
// wherever the URL stands in a text.
var userInfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]*@`)

func newRedactor(c *Config) *redactor {
	var secrets []string
	add := func(secret string) {
		if secret == "" {
			return
		}
		// The forms a library may print it in: as given, and escaped for a URL.
		secrets = append(secrets, secret, url.PathEscape(secret), url.QueryEscape(secret))
	}
	for _, server := range c.Servers {
		info := serverUserInfo(server)
		add(info)
		if _, password, ok := strings.Cut(info, ":"); ok {
			add(password)
			if u, err := url.Parse(server); err == nil && u.User != nil {
				add(u.User.String())
			}
		}
	}
	add(c.Connection.Token)
	add(c.Connection.Password)
	if len(secrets) == 0 {
		return &redactor{}
	}
	// Longest first, so a secret that contains another is removed whole.
	sort.Slice(secrets, func(i, j int) bool { return len(secrets[i]) > len(secrets[j]) })
	pairs := make([]string, 0, 2*len(secrets))
	for _, secret := range secrets {
		pairs = append(pairs, secret, redacted)
	}
	return &redactor{secrets: strings.NewReplacer(pairs...)}
}

// serverUserInfo is the user information of a server URL as nats.go reads it: whatever stands
// before the last '@' of the authority, scheme or no scheme. A host never contains '@', so the
// last one ends it, however many '@', '/' or spaces a password has.
func serverUserInfo(server string) string {
	if _, rest, ok := strings.Cut(server, "://"); ok {
		server = rest
	}
	at := strings.LastIndex(server, "@")
	if at < 0 {
		return ""
	}
	return server[:at]
}

// text returns s without secrets.
func (r *redactor) text(s string) string {
	if r.secrets != nil {
		s = r.secrets.Replace(s)
	}
	return userInfo.ReplaceAllString(s, "${1}"+redacted+"@")
}

// err returns err, or an error of the same text without secrets.
func (r *redactor) err(err error) error {
	if err == nil {
		return nil
	}
	if text := r.text(err.Error()); text != err.Error() {
		return errors.New(text)
	}
	return err
}
