//go:build !windows

package main

import (
	"math"
	"syscall"
)

// notifier wakes a host's event loop: one byte written to a descriptor it watches (the write
// end of a pipe or a socket pair, non-blocking).
type notifier struct{ fd int }

func newNotifier(fd uintptr) (*notifier, error) {
	if int(fd) < 0 || fd > math.MaxInt32 { // the kernel would cut a larger value to another descriptor
		return nil, argError("notify must be -1 or an open file descriptor")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		return nil, argError("notify is not an open file descriptor")
	}
	return &notifier{fd: int(fd)}, nil
}

// signal writes one byte. A full pipe means a byte is already waiting, which wakes the host as
// well, so EAGAIN is ignored like every other error: a closed descriptor is the host's mistake
// and must not stop deliveries.
func (n *notifier) signal() {
	for {
		_, err := syscall.Write(n.fd, []byte{1})
		if err != syscall.EINTR {
			return
		}
	}
}
