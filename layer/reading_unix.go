//go:build !windows

package layer

import "syscall"

// framingSupported: the layer can read a socket's descriptor itself (reading.go).
const framingSupported = true

const errWouldBlock = syscall.EAGAIN

func readIgnoringEINTR(fd int, p []byte) (int, error) {
	for {
		n, err := syscall.Read(fd, p)
		if err != syscall.EINTR {
			return n, err
		}
	}
}

// peek reports whether the socket fd has bytes, or its end, to read.
func peek(fd uintptr) bool {
	var one [1]byte
	n, _, err := syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n >= 0
}
