package layer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxNameLength mirrors Channels' BaseChannelLayer.MAX_NAME_LENGTH: names must be shorter than this.
const maxNameLength = 100

// NameError reports a channel, group or prefix name that the layer refuses.
// The Python package raises it as TypeError, as Channels does for invalid names.
type NameError struct {
	Kind string // "channel", "group" or "prefix"
	Name string
	Rule string
}

// Error names the refused name and the rule it breaks.
func (e *NameError) Error() string {
	return fmt.Sprintf("invalid %s name %q: %s", e.Kind, e.Name, e.Rule)
}

// Subject tokens come from the part of a name before "!" (or the whole name). Channels allows
// ASCII letters, digits, "-", "_" and "."; NATS additionally needs every dot-separated token to be
// non-empty, or the server would read a different subject.
func isSubjectNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// checkSubjectPart validates the part of a name that is inserted verbatim into a subject.
func checkSubjectPart(kind, name, part string) error {
	if part == "" {
		return &NameError{kind, name, "it is empty"}
	}
	for i := 0; i < len(part); i++ {
		if !isSubjectNameByte(part[i]) {
			return &NameError{kind, name, fmt.Sprintf("character %q is not allowed; use ASCII letters, digits, '-', '_' and '.'", part[i])}
		}
	}
	if part[0] == '.' || part[len(part)-1] == '.' || strings.Contains(part, "..") {
		return &NameError{kind, name, "a leading, trailing or doubled '.' would make an empty NATS subject token"}
	}
	return nil
}

// checkLocalPart validates the part after "!" of a process channel name. It never reaches a
// subject, only the Channel header, so Channels' rule applies: word characters, '-', '_' and '.'.
func checkLocalPart(name, local string) error {
	for _, r := range local {
		if r == '-' || r == '_' || r == '.' || unicode.IsLetter(r) || unicode.IsNumber(r) { // Python's \w
			continue
		}
		return &NameError{"channel", name, fmt.Sprintf("character %q is not allowed after '!'", r)}
	}
	return nil
}

// ValidateChannelName checks a channel name: Channels' rules plus what NATS subjects need.
func ValidateChannelName(name string) error {
	if utf8.RuneCountInString(name) >= maxNameLength {
		return &NameError{"channel", name, fmt.Sprintf("it must be shorter than %d characters", maxNameLength)}
	}
	nonLocal, local, isProcess := strings.Cut(name, "!")
	if err := checkSubjectPart("channel", name, nonLocal); err != nil {
		return err
	}
	if isProcess {
		return checkLocalPart(name, local)
	}
	return nil
}

// ValidateGroupName checks a group name: Channels' rules plus what NATS subjects need.
func ValidateGroupName(name string) error {
	if len(name) >= maxNameLength {
		return &NameError{"group", name, fmt.Sprintf("it must be shorter than %d characters", maxNameLength)}
	}
	return checkSubjectPart("group", name, name)
}

// validatePrefix checks a subject prefix (Config.Prefix) or a new_channel prefix. Its length is
// bounded like a name's, so subjects stay far below the server's control line limit.
func validatePrefix(prefix string) error {
	if len(prefix) >= maxNameLength {
		return &NameError{"prefix", prefix, fmt.Sprintf("it must be shorter than %d characters", maxNameLength)}
	}
	return checkSubjectPart("prefix", prefix, prefix)
}

// IsProcessChannel reports whether name is a process channel ("X!Y"), routed by the Channel header.
func IsProcessChannel(name string) bool {
	return strings.IndexByte(name, '!') >= 0
}

// subjects maps names to the subjects and queue groups of the wire contract (SPEC section 3).
// Names are inserted verbatim, so they must have been validated first.
type subjects struct {
	prefix string
}

// channel is the subject a send to name is published on.
func (s subjects) channel(name string) string {
	if nonLocal, _, ok := strings.Cut(name, "!"); ok {
		return s.process(nonLocal)
	}
	return s.prefix + ".ch." + name
}

// process is the subject of one client's process channels: nonLocal is "specific.<client id>".
func (s subjects) process(nonLocal string) string { return s.prefix + ".pc." + nonLocal }

// group is the subject group_send publishes on.
func (s subjects) group(name string) string { return s.prefix + ".grp." + name }

// queue is the queue group shared by every reader of plain channel name, on both its channel
// subject and the group subjects it is a member of.
func (s subjects) queue(name string) string { return s.prefix + ".ch." + name }

// ChannelSubject returns the NATS subject a message sent to channel travels on, for programs that
// publish or subscribe without this package. The name must be valid.
func ChannelSubject(prefix, channel string) (string, error) {
	if err := validatePrefix(prefix); err != nil {
		return "", err
	}
	if err := ValidateChannelName(channel); err != nil {
		return "", err
	}
	return subjects{prefix}.channel(channel), nil
}

// GroupSubject returns the NATS subject group_send(group) publishes on.
func GroupSubject(prefix, group string) (string, error) {
	if err := validatePrefix(prefix); err != nil {
		return "", err
	}
	if err := ValidateGroupName(group); err != nil {
		return "", err
	}
	return subjects{prefix}.group(group), nil
}
