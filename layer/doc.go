// Package layer is a Django Channels channel layer on Core NATS, as a Go library.
//
// A Layer is one NATS connection and the channel-layer state of one client: mailboxes that buffer
// messages per channel name, group memberships, and the subscriptions that feed them. Go programs
// (a WebSocket front, a worker) use it directly; the C ABI in capi/ wraps it for C, Rust and the
// Python package. Every process that uses the same NATS server and subject prefix joins the same
// layer, whatever its language, including processes of the nats-py based reference layer.
//
// # Wire contract
//
// With prefix p (default "channels"):
//
//	send to a process channel "X!Y"  -> subject p.pc.X, header "Channel: X!Y"
//	send to a plain channel c        -> subject p.ch.c, read in queue group p.ch.c
//	group_send to g                  -> subject p.grp.g
//	plain member c of group g        -> reads p.grp.g in queue group p.ch.c
//
// Bodies are the message itself as a msgpack map with string keys (see ValidateFrame).
//
// # Semantics
//
// Delivery is at most once (Core NATS only, nothing on disk). Mailboxes hold at most Capacity
// messages each; new messages to a full mailbox are dropped and counted, never blocked on.
// Everything one Layer receives is delivered in arrival order across all its subscriptions,
// because every inbound message is routed in that order, one at a time (by the connection's
// reader, or by the dispatcher goroutine in a burst). Receives are cancellable
// through their context and never lose a message when cancelled. The numbered rules S1-S20 of the
// project's SPEC.md are mapped to tests in docs/test-plan.md.
//
// # Concurrency
//
// All methods are safe for concurrent use. No method blocks on network I/O beyond its context,
// except Close, which is bounded by the drain timeout.
//
// The connection is read by a goroutine of the layer, unless the host reads it on its own event
// loop: it watches ReadEvents and calls OnReadable when that is readable, and a message then
// reaches its waiting receive on the loop's thread. A host that stops calling is taken over
// after hostReadCheck (see reading.go).
package layer
