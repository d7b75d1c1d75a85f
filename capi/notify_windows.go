//go:build windows

package main

import "syscall"

// notifier wakes a host's event loop: one byte sent on a socket it watches (one end of a
// socket pair; Windows has no pipes an event loop can watch).
type notifier struct{ socket syscall.Handle }

func newNotifier(socket uintptr) (*notifier, error) {
	if syscall.Handle(socket) == syscall.InvalidHandle {
		return nil, argError("notify must be -1 or a socket")
	}
	return &notifier{socket: syscall.Handle(socket)}, nil
}

// signal sends one byte. WSAEWOULDBLOCK means bytes are already waiting, which wakes the host as
// well, so errors are ignored: a closed socket is the host's mistake and must not stop deliveries.
func (n *notifier) signal() {
	b := byte(1)
	buf := syscall.WSABuf{Len: 1, Buf: &b}
	var sent uint32
	_ = syscall.WSASend(n.socket, &buf, 1, &sent, 0, nil, nil)
}
