package layer

import (
	"context"

	"github.com/nats-io/nats.go"
)

// StartSend publishes a msgpack body to a channel without waiting: when the outbound buffer has
// room the message is accepted at once (a nil *Op); otherwise done is called once, later, when
// it was accepted (nil) or with why it never will be (*PublishTimeoutError after
// PublishDeadline, ErrClosed), unless the Op is cancelled first (then nothing is sent).
//
// The body must be a valid wire message without the reserved key (*FrameError otherwise, S8);
// with its headers it must fit the server's max_payload (*MessageTooLargeError, S7). Nothing is
// sent when it returns an error. The body is copied: the caller may reuse it at once. A message
// sent to a channel nobody receives on is lost (S1).
func (l *Layer) StartSend(channel string, body []byte, done func(error)) (*Op, error) {
	target, err := l.targets.of(channel)
	if err != nil {
		return nil, err
	}
	return l.startPublish(&nats.Msg{Subject: target.subject, Header: target.header, Data: body}, done)
}

// StartGroupSend publishes a msgpack body once on the group's subject; the server fans it out
// to every member in every process, and each process to its process-channel members in the
// order they joined. The rules of StartSend apply. A group with no members is not an error.
func (l *Layer) StartGroupSend(group string, body []byte, done func(error)) (*Op, error) {
	subject, err := l.targets.ofGroup(group)
	if err != nil {
		return nil, err
	}
	return l.startPublish(&nats.Msg{Subject: subject, Data: body}, done)
}

func (l *Layer) startPublish(m *nats.Msg, done func(error)) (*Op, error) {
	if err := validateOutbound(m.Data); err != nil {
		return nil, err
	}
	size := int64(len(m.Data) + headerSize(m.Header))
	if limit := l.maxPayload.Load(); size > limit {
		return nil, &MessageTooLargeError{Size: size, MaxPayload: limit}
	}
	wire := int(size) + len(m.Subject)
	if l.link.tryInline(m, size, wire) { // written or copied to the socket: no copy of ours is needed
		return nil, nil
	}
	data, pooled := copyBody(m.Data)
	m.Data = data
	op, err := l.link.publish(m, wire, pooled, done)
	if err != nil && pooled != nil {
		releaseBody(pooled)
	}
	return op, err
}

// SendRaw is StartSend that waits, within ctx, until the message is accepted.
func (l *Layer) SendRaw(ctx context.Context, channel string, body []byte) error {
	return awaitDone(ctx, func(done func(error)) (*Op, error) { return l.StartSend(channel, body, done) })
}

// GroupSendRaw is StartGroupSend that waits, within ctx, until the message is accepted.
func (l *Layer) GroupSendRaw(ctx context.Context, group string, body []byte) error {
	return awaitDone(ctx, func(done func(error)) (*Op, error) { return l.StartGroupSend(group, body, done) })
}

// Send encodes msg and sends it (see SendRaw). Values may be nil, bool, any integer type,
// float32, float64, string, []byte, []any, []string, map[string]any and map[string]string;
// anything else is a *FrameError.
func (l *Layer) Send(ctx context.Context, channel string, msg map[string]any) error {
	body, err := encodeMessage(msg)
	if err != nil {
		return err
	}
	return l.SendRaw(ctx, channel, body)
}

// GroupSend encodes msg and sends it to every member of group (see GroupSendRaw and Send).
func (l *Layer) GroupSend(ctx context.Context, group string, msg map[string]any) error {
	body, err := encodeMessage(msg)
	if err != nil {
		return err
	}
	return l.GroupSendRaw(ctx, group, body)
}

// awaitDone runs an operation that reports only an error and waits for it within ctx.
func awaitDone(ctx context.Context, start func(done func(error)) (*Op, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	got := make(chan error, 1)
	op, err := start(func(err error) { got <- err })
	if err != nil || op == nil {
		return err
	}
	res, err := wait(ctx, op, got)
	if err != nil {
		return err
	}
	return res
}
