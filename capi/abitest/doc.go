//go:build linux

// Package abitest tests the C ABI of channels-nats (include/channels_nats.h) by loading the
// built shared library, build/<goos>-<goarch>/libchannels_nats.so, through purego: every cn_*
// function is called as a C host would call it, and the callbacks come back into Go through
// purego.NewCallback. Build the library first with `make lib`; CN_LIB overrides its path.
//
// The library holds a Go runtime of its own, so the test binary runs two Go runtimes in one
// process. That works on Linux and is used here as a smoke test of the ABI contract; the package
// is Linux-only and is its own test binary. The callbacks are created once per binary (purego
// allows about 2000 per process): their closure values are small integers that index the
// waiters and log sinks registered by the tests.
package abitest
