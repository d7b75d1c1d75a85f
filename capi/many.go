package main

/*
#include "bridge.h"
*/
import "C"

import (
	"encoding/binary"
	"math"
	"time"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
)

// A block of messages (cn_receive_many, cn_put_back_many) holds records back to back: the body
// length and the milliseconds the message has left before it expires, both uint32 little-endian,
// then the body.
const recordHeader = 8

//export cngo_receive_many
func cngo_receive_many(h C.cn_client, channel *C.char, limit C.size_t, blockOut **C.uint8_t,
	lenOut *C.size_t, countOut *C.size_t) (st C.cn_status) {
	defer recoverStatus(&st)
	if blockOut == nil || lenOut == nil || countOut == nil {
		return fail(argError("block, len and count must not be NULL"))
	}
	*blockOut, *lenOut, *countOut = nil, 0, 0
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	name, err := goString(channel, "channel", true)
	if err != nil {
		return fail(err)
	}
	taken, err := l.TakeReceive(name, int(min(limit, math.MaxInt32)))
	if err != nil || len(taken) == 0 {
		return result(err)
	}
	size := 0
	for _, m := range taken {
		size += recordHeader + len(m.Body)
	}
	block := unsafe.Slice((*byte)(C.malloc(C.size_t(size))), size)
	now, at := time.Now(), 0
	for _, m := range taken {
		left := min(l.TimeLeft(m, now).Milliseconds(), math.MaxUint32)
		binary.LittleEndian.PutUint32(block[at:], uint32(len(m.Body)))
		binary.LittleEndian.PutUint32(block[at+4:], uint32(left))
		at += recordHeader + copy(block[at+recordHeader:], m.Body)
	}
	*blockOut, *lenOut, *countOut = (*C.uint8_t)(unsafe.Pointer(&block[0])), C.size_t(size), C.size_t(len(taken))
	return C.CN_OK
}

//export cngo_put_back_many
func cngo_put_back_many(h C.cn_client, channel *C.char, blockIn *C.uint8_t, n C.size_t) (st C.cn_status) {
	defer recoverStatus(&st)
	l, name, block, err := putBackArgs(h, channel, blockIn, n, "block")
	if err != nil {
		return fail(err)
	}
	var msgs []layer.Message
	for len(block) > 0 {
		if len(block) < recordHeader {
			return fail(argError("block ends inside a record header"))
		}
		size := int(binary.LittleEndian.Uint32(block))
		left := time.Duration(binary.LittleEndian.Uint32(block[4:])) * time.Millisecond
		if len(block)-recordHeader < size {
			return fail(argError("block ends inside a message body"))
		}
		body := append([]byte(nil), block[recordHeader:recordHeader+size]...)
		msgs = append(msgs, l.Returned(name, body, left))
		block = block[recordHeader+size:]
	}
	l.PutBack(msgs...)
	return C.CN_OK
}
