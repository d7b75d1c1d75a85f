package layer

import "errors"

// framingSupported: on Windows nats.go frames what the layer's sockets read, and its reader
// reads them (reading.go is not used).
const framingSupported = false

var errWouldBlock = errors.New("unused on windows")

func readIgnoringEINTR(int, []byte) (int, error) { return 0, errors.ErrUnsupported }

func peek(uintptr) bool { return false }
