//go:build linux

// Package abitest tests the C ABI of channels-nats (include/channels_nats.h) by loading the
// built shared library, build/<goos>-<goarch>/libchannels_nats.so, through purego: every cn_*
// function is called as a C host would call it. Results of pending operations are taken from
// result queues (cn_queue_new, cn_queue_take) the way the header tells a host to: wait until the
// notify pipe is readable, read its bytes, then take. The log callback is the only call from the
// library into the test; it comes back into Go through purego.NewCallback. Build the library
// first with `make lib`; CN_LIB overrides its path.
//
// The library holds a Go runtime of its own, so the test binary runs two Go runtimes in one
// process. That works on Linux and is used here as a smoke test of the ABI contract; the package
// is Linux-only and is its own test binary. The log callback is created once per binary (purego
// allows about 2000 callbacks per process): its closure values are small integers that index
// the log sinks registered by the tests.
package abitest
