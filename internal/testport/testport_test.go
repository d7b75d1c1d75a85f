package testport

import (
	"fmt"
	"net"
	"testing"
)

// The ports are below the ephemeral range, free when given and different each time.
func TestFreeGivesDistinctFreePortsBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		port := Free(t)
		if port < first || port >= first+count || port >= 32768 {
			t.Fatalf("port %d is outside %d-%d", port, first, first+count-1)
		}
		if seen[port] {
			t.Fatalf("port %d was given twice", port)
		}
		seen[port] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		_ = ln.Close()
	}
}

// A port something listens on is passed over.
func TestFreeSkipsAPortInUse(t *testing.T) {
	held := candidate(tried.Load() + 1)
	if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", held)); err == nil {
		defer ln.Close()
	} // else something else holds it already: in use either way
	if port := Free(t); port == held {
		t.Fatalf("Free gave port %d, which is in use", port)
	}
}
