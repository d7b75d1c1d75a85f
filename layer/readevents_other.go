//go:build !linux

package layer

// readEvents: only Linux has them (an epoll descriptor); elsewhere nats.go's reader reads.
type readEvents struct{}

func (*readEvents) descriptor(*socket) (int, error) { return -1, ErrNoReadEvents }
func (*readEvents) watch(*socket)                   {}
func (*readEvents) unwatch(*socket)                 {}
func (*readEvents) close()                          {}
