package layer

import (
	"math/bits"
	"sync"
)

// Bodies of outbound messages are copied into buffers from a pool and given back once nats.go
// has copied them into its write buffer: a host that sends large messages at a high rate would
// otherwise make the garbage collector run, and stop the world, again and again.
const (
	minBodyClass = 10 // 1 KiB: smaller bodies are cheap to allocate
	maxBodyClass = 26 // 64 MiB, the largest max_payload a server accepts
)

var bodyPools [maxBodyClass + 1]sync.Pool

// bodyClass is the pool of buffers of 1<<class bytes that fits n bytes; -1 when none does.
func bodyClass(n int) int {
	class := bits.Len(uint(n - 1))
	if n <= 1<<minBodyClass || class > maxBodyClass {
		return -1
	}
	return class
}

// copyBody returns a copy of b, in a buffer of the pool when b is large enough to be worth it:
// then buf is that buffer, to give back with releaseBody (nil otherwise). The pool holds the
// buffers' own pointers, so giving one back allocates nothing.
func copyBody(b []byte) (body []byte, buf *[]byte) {
	class := bodyClass(len(b))
	if class < 0 {
		return append([]byte(nil), b...), nil
	}
	buf, _ = bodyPools[class].Get().(*[]byte)
	if buf == nil {
		fresh := make([]byte, 1<<class)
		buf = &fresh
	}
	return append((*buf)[:0], b...), buf
}

// releaseBody gives a buffer of copyBody back; nothing may use its body afterwards.
func releaseBody(buf *[]byte) {
	bodyPools[bodyClass(len(*buf))].Put(buf)
}
