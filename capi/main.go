// Command capi is the C ABI of channels-nats: built with -buildmode=c-shared it becomes
// libchannels_nats, whose public header is include/channels_nats.h. It is a thin shim over the
// layer package: handles for clients, pending operations and result queues, status codes, and
// the queues that hold results until the host takes them.
//
// The exported symbols are the cn_* functions of wrappers.c; they check for a fork and then call
// the cngo_* functions of exports.go. exports.map keeps every other symbol local.
package main

func main() {}
