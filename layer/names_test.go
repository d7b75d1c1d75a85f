package layer

import (
	"errors"
	"strings"
	"testing"
	"unicode"
)

// wantNameError fails the test unless err is a *NameError of the given kind with a rule text.
func wantNameError(t *testing.T, err error, kind, name string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s name %q: accepted, want a *NameError", kind, name)
	}
	var ne *NameError
	if !errors.As(err, &ne) {
		t.Fatalf("%s name %q: error %v (%T) is not a *NameError", kind, name, err, err)
	}
	if ne.Kind != kind {
		t.Errorf("%s name %q: NameError.Kind = %q", kind, name, ne.Kind)
	}
	if ne.Name != name {
		t.Errorf("%s name %q: NameError.Name = %q", kind, name, ne.Name)
	}
	if strings.TrimSpace(ne.Rule) == "" {
		t.Errorf("%s name %q: NameError.Rule is empty", kind, name)
	}
	if !strings.Contains(err.Error(), ne.Rule) {
		t.Errorf("%s name %q: Error() %q does not contain the rule %q", kind, name, err.Error(), ne.Rule)
	}
}

var (
	hex12 = "0123456789ab"
	hex32 = "0123456789abcdef0123456789abcdef"
)

func TestValidateChannelNameAccepts(t *testing.T) {
	for _, name := range []string{
		"test-channel",
		"a",
		"a.b_c-1",
		"A.B.C",
		"http.request",
		"websocket.receive",
		"_",
		"-",
		"specific." + hex12 + "!" + hex32,
		"specific.abc!x",
		"specific.abc!",          // the process-prefix form receive() uses
		"specific.abc!안녕",        // unicode letters after '!'
		"specific.abc!été_1-2.3", // letters, digits, '_', '-', '.'
		"specific.abc!٣",         // a non-ASCII decimal digit
		strings.Repeat("a", maxNameLength-1),
		strings.Repeat("a.", 49) + "b",
		"specific." + strings.Repeat("b", maxNameLength-len("specific.")-3) + "!c",
	} {
		if err := ValidateChannelName(name); err != nil {
			t.Errorf("ValidateChannelName(%q) = %v, want nil", name, err)
		}
	}
}

func TestValidateChannelNameRefuses(t *testing.T) {
	for _, tc := range []struct {
		desc, name string
	}{
		{"empty", ""},
		{"only a bang", "!"},
		{"empty part before bang", "!abc"},
		{"doubled dot", "a..b"},
		{"leading dot", ".a"},
		{"trailing dot", "a."},
		{"lone dot", "."},
		{"trailing dot before bang", "specific.!abc"},
		{"space", "has space"},
		{"star", "bad*name"},
		{"star token", "a.*"},
		{"greater-than", "a>b"},
		{"greater-than token", "a.>"},
		{"tab", "a\tb"},
		{"newline", "a\nb"},
		{"trailing newline", "abc\n"},
		{"trailing newline after bang", "specific.abc!x\n"},
		{"carriage return", "abc\r"},
		{"NUL", "a\x00b"},
		{"second bang", "x!y!z"},
		{"second bang at end", "specific.abc!def!"},
		{"space after bang", "specific.abc!x y"},
		{"star after bang", "specific.abc!*"},
		{"length 100", strings.Repeat("a", maxNameLength)},
		{"length 150", strings.Repeat("a", 150)},
		{"length 100 process", "specific.abc!" + strings.Repeat("x", maxNameLength-len("specific.abc!"))},
		{"non-ASCII before bang", "caf\u00e9"},
		{"non-ASCII before bang, process", "spé.abc!x"},
		{"hangul before bang", "안녕"},
		{"invalid UTF-8", "a\xffb"},
		{"slash", "a/b"},
		{"colon", "a:b"},
		{"unicode space", "a\u00a0b"},
	} {
		wantNameError(t, ValidateChannelName(tc.name), "channel", tc.name)
	}
}

func TestValidateGroupName(t *testing.T) {
	for _, name := range []string{"room-1", "a.b_c-1", "chat", strings.Repeat("g", maxNameLength-1), "A9._-"} {
		if err := ValidateGroupName(name); err != nil {
			t.Errorf("ValidateGroupName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{
		"", "a..b", ".a", "a.", "has space", "bad*name", "a>b", "a\tb", "a\nb", "room\n",
		"x!y", "room!", strings.Repeat("g", maxNameLength), "caf\u00e9", "a.*", "a.>",
	} {
		wantNameError(t, ValidateGroupName(name), "group", name)
	}
}

func TestValidatePrefix(t *testing.T) {
	for _, p := range []string{"channels", "app", "my-app.v2", "A_b"} {
		if err := validatePrefix(p); err != nil {
			t.Errorf("validatePrefix(%q) = %v, want nil", p, err)
		}
	}
	for _, p := range []string{"", "a..b", ".app", "app.", "my app", "app.*", "app.>", "a!b", "app\n", "präfix"} {
		wantNameError(t, validatePrefix(p), "prefix", p)
	}
}

func TestIsProcessChannel(t *testing.T) {
	for name, want := range map[string]bool{
		"specific.abc!def": true, "specific.abc!": true, "plain": false, "a.b.c": false,
	} {
		if got := IsProcessChannel(name); got != want {
			t.Errorf("IsProcessChannel(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestSubjectMapping(t *testing.T) {
	s := subjects{"app"}
	for _, tc := range []struct {
		desc, got, want string
	}{
		{"plain channel", s.channel("test-channel"), "app.ch.test-channel"},
		{"dotted plain channel", s.channel("http.request"), "app.ch.http.request"},
		{"process channel", s.channel("specific.ab!cd"), "app.pc.specific.ab"},
		{"process prefix", s.channel("specific.ab!"), "app.pc.specific.ab"},
		{"new_channel name", s.channel("specific." + hex12 + "!" + hex32), "app.pc.specific." + hex12},
		{"group", s.group("room-1"), "app.grp.room-1"},
		{"queue", s.queue("c"), "app.ch.c"},
		{"process", s.process("specific.abc123"), "app.pc.specific.abc123"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.desc, tc.got, tc.want)
		}
	}
	// A plain channel's queue group is its channel subject (wire contract, section 3).
	if s.queue("work") != s.channel("work") {
		t.Errorf("queue(%q) = %q differs from channel() = %q", "work", s.queue("work"), s.channel("work"))
	}
}

func TestChannelSubject(t *testing.T) {
	for _, tc := range []struct {
		prefix, channel, want string
	}{
		{"channels", "test-channel", "channels.ch.test-channel"},
		{"app", "specific.ab!cd", "app.pc.specific.ab"},
		{"my.app", "a.b", "my.app.ch.a.b"},
	} {
		got, err := ChannelSubject(tc.prefix, tc.channel)
		if err != nil || got != tc.want {
			t.Errorf("ChannelSubject(%q, %q) = %q, %v; want %q, nil", tc.prefix, tc.channel, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		prefix, channel, kind, bad string
	}{
		{"", "c", "prefix", ""},
		{"a..b", "c", "prefix", "a..b"},
		{"app.", "c", "prefix", "app."},
		{"channels", "a..b", "channel", "a..b"},
		{"channels", "has space", "channel", "has space"},
		{"channels", "x!y!z", "channel", "x!y!z"},
		{"channels", "", "channel", ""},
	} {
		got, err := ChannelSubject(tc.prefix, tc.channel)
		if got != "" {
			t.Errorf("ChannelSubject(%q, %q) returned subject %q with an error", tc.prefix, tc.channel, got)
		}
		wantNameError(t, err, tc.kind, tc.bad)
	}
}

func TestGroupSubject(t *testing.T) {
	for _, tc := range []struct {
		prefix, group, want string
	}{
		{"channels", "room-1", "channels.grp.room-1"},
		{"app", "a.b_c", "app.grp.a.b_c"},
	} {
		got, err := GroupSubject(tc.prefix, tc.group)
		if err != nil || got != tc.want {
			t.Errorf("GroupSubject(%q, %q) = %q, %v; want %q, nil", tc.prefix, tc.group, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		prefix, group, kind, bad string
	}{
		{"a b", "room", "prefix", "a b"},
		{"channels", "room!x", "group", "room!x"},
		{"channels", "a.", "group", "a."},
		{"channels", "", "group", ""},
	} {
		got, err := GroupSubject(tc.prefix, tc.group)
		if got != "" {
			t.Errorf("GroupSubject(%q, %q) returned subject %q with an error", tc.prefix, tc.group, got)
		}
		wantNameError(t, err, tc.kind, tc.bad)
	}
}

// checkNATSSubject reports why subject is not a subject NATS reads as written, or "".
func checkNATSSubject(subject string) string {
	if subject == "" {
		return "empty subject"
	}
	for _, r := range subject {
		if unicode.IsSpace(r) {
			return "whitespace"
		}
		if r < 0x21 || r > 0x7e {
			return "not printable ASCII"
		}
		if r == '*' || r == '>' {
			return "wildcard character"
		}
	}
	for _, tok := range strings.Split(subject, ".") {
		if tok == "" {
			return "empty token"
		}
	}
	return ""
}

var nameSeeds = []string{
	"", "test-channel", "a.b_c-1", "specific." + hex12 + "!" + hex32, "specific.abc!안녕", "specific.abc!",
	"a..b", ".a", "a.", "has space", "bad*name", "a>b", "a\tb", "abc\n", "x!y!z", "!", "!x", "a.*", "a.>",
	"caf\u00e9", strings.Repeat("a", 99), strings.Repeat("a", 100), "a\u00a0b", "a\u2028b", "a\xffb",
}

func FuzzChannelSubject(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	s := subjects{"channels"}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateChannelName(name) != nil {
			return
		}
		subject := s.channel(name)
		if why := checkNATSSubject(subject); why != "" {
			t.Fatalf("valid channel %q maps to subject %q: %s", name, subject, why)
		}
		if nonLocal, _, ok := strings.Cut(name, "!"); ok {
			if subject != "channels.pc."+nonLocal {
				t.Fatalf("process channel %q maps to %q, want %q", name, subject, "channels.pc."+nonLocal)
			}
			return
		}
		rest, ok := strings.CutPrefix(subject, "channels.ch.")
		if !ok {
			t.Fatalf("plain channel %q maps to %q, which does not start with channels.ch.", name, subject)
		}
		// The ch side is injective: the name comes back from the subject unchanged.
		if rest != name {
			t.Fatalf("plain channel %q maps to %q; the name part %q differs", name, subject, rest)
		}
		got, err := ChannelSubject("channels", name)
		if err != nil || got != subject {
			t.Fatalf("ChannelSubject(channels, %q) = %q, %v; want %q", name, got, err, subject)
		}
	})
}

func FuzzGroupSubject(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	s := subjects{"channels"}
	f.Fuzz(func(t *testing.T, name string) {
		if ValidateGroupName(name) != nil {
			return
		}
		subject := s.group(name)
		if why := checkNATSSubject(subject); why != "" {
			t.Fatalf("valid group %q maps to subject %q: %s", name, subject, why)
		}
		rest, ok := strings.CutPrefix(subject, "channels.grp.")
		if !ok || rest != name {
			t.Fatalf("group %q maps to %q, want channels.grp.%s", name, subject, name)
		}
		// A valid group name is also a valid plain channel name on the same token rules.
		if err := ValidateChannelName(name); err != nil {
			t.Fatalf("valid group name %q is not a valid channel name: %v", name, err)
		}
	})
}

// The part after "!" follows Python's \w (letters and every kind of number, no combining marks),
// and length counts characters, as Channels does.
func TestLocalPartFollowsPythonWordCharacters(t *testing.T) {
	for _, ok := range []string{"specific.abc!²", "specific.abc!Ⅻ", "specific.abc!" + strings.Repeat("안", 50)} {
		if err := ValidateChannelName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"specific.abc!e\u0301", "specific.abc!" + strings.Repeat("안", 90)} {
		if err := ValidateChannelName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
