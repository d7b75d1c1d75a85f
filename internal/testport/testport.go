// Package testport gives tests loopback ports for the servers they start.
//
// Asking the kernel for a free port (listening on port 0 and closing) hands out a port of the
// ephemeral range (32768-60999 on Linux), and once it is closed, any outgoing connection of a
// test running in parallel may get it as its local port before the server binds it: the server
// then cannot start. The ports given here lie below that range, where no connection's local port
// comes from, and each process starts at its own place in it.
package testport

import (
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
)

const (
	first = 20000 // below every default ephemeral range (Linux 32768, BSDs and macOS 49152)
	count = 12000 // ports first to first+count-1
)

var (
	offset = uint32(os.Getpid()) * 389 // the processes of one go test run start apart
	tried  atomic.Uint32
)

// candidate is the port of the n-th try in this process.
func candidate(n uint32) int { return first + int((offset+n)%count) }

// Free returns a loopback port that nothing listens on now.
func Free(t testing.TB) int {
	t.Helper()
	for range count {
		port := candidate(tried.Add(1))
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		return port
	}
	t.Fatalf("testport: no free loopback port in %d-%d", first, first+count-1)
	return 0
}
