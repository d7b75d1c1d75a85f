package layer

import (
	"sync"
	"syscall"
)

// readEvents is what a host watches to know when the layer's connection has bytes to read: an
// epoll descriptor holding the established socket (level-triggered), which is itself readable
// while that socket is. It stays the same across reconnects, so the host registers it once.
type readEvents struct {
	mu      sync.Mutex
	fd      int
	made    bool
	closed  bool
	watched *socket
}

// descriptor returns the epoll descriptor, made on first use with the socket established now.
func (e *readEvents) descriptor(current *socket) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return -1, ErrClosed
	}
	if !e.made {
		fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return -1, err
		}
		e.fd, e.made = fd, true
		if current != nil && current.established.Load() {
			e.watchLocked(current)
		}
	}
	return e.fd, nil
}

func (e *readEvents) watch(s *socket) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.made && !e.closed {
		e.watchLocked(s)
	}
}

func (e *readEvents) watchLocked(s *socket) {
	if e.watched != nil {
		e.control(e.watched, syscall.EPOLL_CTL_DEL)
	}
	e.watched = s
	e.control(s, syscall.EPOLL_CTL_ADD)
}

func (e *readEvents) unwatch(s *socket) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.watched == s {
		e.control(s, syscall.EPOLL_CTL_DEL)
		e.watched = nil
	}
}

// control adds s's descriptor to the set or deletes it. A socket that closed meanwhile has left
// the set with its descriptor.
func (e *readEvents) control(s *socket, op int) {
	_ = s.raw.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
		_ = syscall.EpollCtl(e.fd, op, int(fd), &ev)
	})
}

// close ends the set (the layer closed). A host that keeps a duplicate of the descriptor
// watches an empty set from then on.
func (e *readEvents) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.made && !e.closed {
		_ = syscall.Close(e.fd)
	}
	e.closed, e.watched = true, nil
}
