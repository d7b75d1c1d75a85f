// Command rawnats is the benchmark ceiling: the shapes the channel layers are measured on, done
// with plain nats.go publish/subscribe and nothing else (layer "raw").
//
//	rawnats -scenario fanout     -nats nats://127.0.0.1:4222 -members 1000 -procs 2 -messages 50 -gap 10ms
//	rawnats -scenario saturation -members 1000 -procs 2 -messages 50          (gap forced to 0)
//	rawnats -scenario pingpong   -roundtrips 10000
//	rawnats -scenario throughput -size 100 (or 65536) [-count N]
//
// fanout/saturation: "procs" separate NATS connections stand in for the layer's member processes;
// each holds members/procs subscriptions to one subject (a member channel of one group each). They
// all live in this one Go process, on separate connections. A further connection publishes
// "messages" messages of "size" bytes, each carrying its send time, "gap" apart; every delivery's
// latency is recorded. pingpong: two connections bounce a message over two subjects. throughput:
// one connection publishes to a subject it is subscribed to and receives everything back.
//
// Progress goes to stderr; the last stdout line is one JSON object:
// {"scenario": ..., "layer": "raw", "params": {...}, "metrics": {...}}.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// config holds the command line.
type config struct {
	Scenario   string
	URL        string
	Members    int
	Procs      int
	Messages   int
	Gap        time.Duration
	Size       int
	Roundtrips int
	Count      int
	Timeout    time.Duration
}

// result is the one JSON object printed on the last stdout line.
type result struct {
	Scenario string         `json:"scenario"`
	Layer    string         `json:"layer"`
	Params   map[string]any `json:"params"`
	Metrics  map[string]any `json:"metrics"`
}

// stampSize is the part of every payload that carries the send time (nanoseconds since base).
const stampSize = 8

func main() {
	var cfg config
	flag.StringVar(&cfg.Scenario, "scenario", "fanout", "fanout | saturation | pingpong | throughput")
	flag.StringVar(&cfg.URL, "nats", nats.DefaultURL, "NATS server URL")
	flag.IntVar(&cfg.Members, "members", 1000, "fanout: member subscriptions in total")
	flag.IntVar(&cfg.Procs, "procs", 2, "fanout: subscriber connections the members are spread over")
	flag.IntVar(&cfg.Messages, "messages", 50, "fanout: messages published")
	flag.DurationVar(&cfg.Gap, "gap", 10*time.Millisecond, "fanout: pause between publishes (saturation: always 0)")
	flag.IntVar(&cfg.Size, "size", 100, "payload bytes (at least 8: the send time)")
	flag.IntVar(&cfg.Roundtrips, "roundtrips", 10000, "pingpong: round trips")
	flag.IntVar(&cfg.Count, "count", 0, "throughput: messages (0: 200000 below 16 KiB, 20000 from 16 KiB)")
	flag.DurationVar(&cfg.Timeout, "timeout", 60*time.Second, "give up waiting for deliveries after this")
	flag.Parse()

	res, err := run(cfg, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rawnats: %v\n", err)
		os.Exit(1)
	}
	out, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rawnats: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

// run executes one scenario and returns its result; progress lines go to logw.
func run(cfg config, logw io.Writer) (*result, error) {
	if cfg.Size < stampSize {
		cfg.Size = stampSize
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	switch cfg.Scenario {
	case "fanout", "saturation":
		if cfg.Scenario == "saturation" {
			cfg.Gap = 0
		}
		return fanout(cfg, logw)
	case "pingpong":
		return pingpong(cfg, logw)
	case "throughput":
		return throughput(cfg, logw)
	default:
		return nil, fmt.Errorf("unknown scenario %q (fanout, saturation, pingpong, throughput)", cfg.Scenario)
	}
}

// percentile returns the p-th percentile (0..100) of sorted values by the nearest-rank method;
// 0 for no values.
func percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// round3 keeps three decimals, enough for milliseconds with microsecond resolution.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// latencyMetrics sorts values (milliseconds) and summarises them under prefix.
func latencyMetrics(values []float64, prefix, unit string, scale float64, into map[string]any) {
	sort.Float64s(values)
	for _, p := range []struct {
		name string
		p    float64
	}{{"p50", 50}, {"p95", 95}, {"p99", 99}, {"max", 100}} {
		into[prefix+p.name+"_"+unit] = round3(percentile(values, p.p) * scale)
	}
}

func connect(url, name string) (*nats.Conn, error) {
	return nats.Connect(url, nats.Name(name), nats.MaxReconnects(0), nats.Timeout(5*time.Second))
}

func stamp(buf []byte, base time.Time) {
	binary.LittleEndian.PutUint64(buf, uint64(time.Since(base)))
}

func fanout(cfg config, logw io.Writer) (*result, error) {
	if cfg.Members < 1 || cfg.Procs < 1 || cfg.Messages < 1 {
		return nil, errors.New("fanout needs -members, -procs and -messages of at least 1")
	}
	if cfg.Procs > cfg.Members {
		cfg.Procs = cfg.Members
	}
	subject := "bench.fanout." + nats.NewInbox()[len(nats.InboxPrefix):]
	expected := int64(cfg.Members) * int64(cfg.Messages)
	base := time.Now()
	lat := make([]int64, expected) // nanoseconds, filled in delivery order
	var delivered, written, lastDelivery atomic.Int64
	done := make(chan struct{})
	var doneOnce sync.Once

	handler := func(m *nats.Msg) {
		now := int64(time.Since(base))
		if len(m.Data) < stampSize {
			return
		}
		sent := int64(binary.LittleEndian.Uint64(m.Data))
		i := delivered.Add(1) - 1
		if i < expected {
			lat[i] = now - sent
		}
		for {
			last := lastDelivery.Load()
			if now <= last || lastDelivery.CompareAndSwap(last, now) {
				break
			}
		}
		// Done when every latency slot is written, not merely claimed, so reading them is safe.
		if i < expected && written.Add(1) == expected {
			doneOnce.Do(func() { close(done) })
		}
	}

	conns := make([]*nats.Conn, 0, cfg.Procs+1)
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	var subs []*nats.Subscription
	for p := 0; p < cfg.Procs; p++ {
		nc, err := connect(cfg.URL, fmt.Sprintf("rawnats-member-%d", p))
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
		}
		conns = append(conns, nc)
		// members/procs each, the remainder on the first connections.
		count := cfg.Members / cfg.Procs
		if p < cfg.Members%cfg.Procs {
			count++
		}
		for i := 0; i < count; i++ {
			sub, err := nc.Subscribe(subject, handler)
			if err != nil {
				return nil, fmt.Errorf("subscribe: %w", err)
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				return nil, err
			}
			subs = append(subs, sub)
		}
		if err := nc.Flush(); err != nil {
			return nil, fmt.Errorf("flush subscriptions: %w", err)
		}
	}
	pub, err := connect(cfg.URL, "rawnats-publisher")
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
	}
	conns = append(conns, pub)
	fmt.Fprintf(logw, "rawnats: %s: %d members over %d connections, %d messages of %d B, gap %s\n",
		cfg.Scenario, cfg.Members, cfg.Procs, cfg.Messages, cfg.Size, cfg.Gap)

	payload := make([]byte, cfg.Size)
	firstPublish := int64(time.Since(base))
	for i := 0; i < cfg.Messages; i++ {
		if i > 0 && cfg.Gap > 0 {
			time.Sleep(cfg.Gap)
		}
		stamp(payload, base)
		if err := pub.Publish(subject, payload); err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
	}
	if err := pub.Flush(); err != nil {
		return nil, fmt.Errorf("flush publishes: %w", err)
	}
	publishEnd := int64(time.Since(base))

	timedOut := false
	select {
	case <-done:
	case <-time.After(cfg.Timeout):
		timedOut = true
		fmt.Fprintf(logw, "rawnats: timed out after %s with %d of %d deliveries\n", cfg.Timeout, delivered.Load(), expected)
	}
	got := delivered.Load()
	if got > expected {
		got = expected
	}
	var dropped int64
	for _, sub := range subs {
		if d, err := sub.Dropped(); err == nil {
			dropped += int64(d)
		}
	}
	values := make([]float64, got)
	for i := int64(0); i < got; i++ {
		values[i] = float64(lat[i]) / 1e6
	}
	metrics := map[string]any{
		"deliveries": got,
		"expected":   expected,
		"dropped":    dropped,
		"timed_out":  timedOut,
	}
	latencyMetrics(values, "latency_", "ms", 1, metrics)
	span := float64(lastDelivery.Load()-firstPublish) / 1e9
	if span > 0 {
		metrics["deliveries_per_s"] = math.Round(float64(got) / span)
	} else {
		metrics["deliveries_per_s"] = 0.0
	}
	metrics["duration_s"] = round3(span)
	metrics["publish_s"] = round3(float64(publishEnd-firstPublish) / 1e9)
	fmt.Fprintf(logw, "rawnats: %d/%d deliveries, p50 %.3f ms, p99 %.3f ms, %.0f deliveries/s\n",
		got, expected, metrics["latency_p50_ms"], metrics["latency_p99_ms"], metrics["deliveries_per_s"])
	return &result{
		Scenario: cfg.Scenario,
		Layer:    "raw",
		Params: map[string]any{
			"members":          cfg.Members,
			"procs":            cfg.Procs,
			"messages":         cfg.Messages,
			"gap_ms":           float64(cfg.Gap) / 1e6,
			"size":             cfg.Size,
			"nats":             cfg.URL,
			"procs_simulation": "one Go process, one NATS connection per proc, members/procs subscriptions to one subject on each",
			"go":               runtime.Version(),
			"cpus":             runtime.NumCPU(),
		},
		Metrics: metrics,
	}, nil
}

func pingpong(cfg config, logw io.Writer) (*result, error) {
	if cfg.Roundtrips < 1 {
		return nil, errors.New("pingpong needs -roundtrips of at least 1")
	}
	suffix := nats.NewInbox()[len(nats.InboxPrefix):]
	ping, pong := "bench.ping."+suffix, "bench.pong."+suffix
	a, err := connect(cfg.URL, "rawnats-ping")
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
	}
	defer a.Close()
	b, err := connect(cfg.URL, "rawnats-pong")
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
	}
	defer b.Close()
	if _, err := b.Subscribe(ping, func(m *nats.Msg) { _ = b.Publish(pong, m.Data) }); err != nil {
		return nil, err
	}
	if err := b.Flush(); err != nil {
		return nil, err
	}
	back, err := a.SubscribeSync(pong)
	if err != nil {
		return nil, err
	}
	if err := a.Flush(); err != nil {
		return nil, err
	}
	payload := make([]byte, cfg.Size)
	warmup := min(100, cfg.Roundtrips)
	fmt.Fprintf(logw, "rawnats: pingpong: %d round trips (+%d warm-up) of %d B\n", cfg.Roundtrips, warmup, cfg.Size)
	rtts := make([]float64, 0, cfg.Roundtrips)
	start := time.Now()
	for i := 0; i < warmup+cfg.Roundtrips; i++ {
		if i == warmup {
			start = time.Now()
		}
		t0 := time.Now()
		if err := a.Publish(ping, payload); err != nil {
			return nil, err
		}
		if _, err := back.NextMsg(5 * time.Second); err != nil {
			return nil, fmt.Errorf("round trip %d: %w", i, err)
		}
		if i >= warmup {
			rtts = append(rtts, float64(time.Since(t0))/1e3) // microseconds
		}
	}
	total := time.Since(start)
	metrics := map[string]any{"roundtrips": len(rtts)}
	sort.Float64s(rtts)
	metrics["rtt_p50_us"] = round3(percentile(rtts, 50))
	metrics["rtt_p99_us"] = round3(percentile(rtts, 99))
	metrics["rtt_max_us"] = round3(percentile(rtts, 100))
	metrics["rtt_p50_ms"] = round3(percentile(rtts, 50) / 1e3)
	metrics["rtt_p99_ms"] = round3(percentile(rtts, 99) / 1e3)
	metrics["roundtrips_per_s"] = math.Round(float64(len(rtts)) / total.Seconds())
	fmt.Fprintf(logw, "rawnats: pingpong p50 %.1f µs, p99 %.1f µs\n", metrics["rtt_p50_us"], metrics["rtt_p99_us"])
	return &result{
		Scenario: "pingpong",
		Layer:    "raw",
		Params: map[string]any{
			"roundtrips": cfg.Roundtrips, "warmup": warmup, "size": cfg.Size, "nats": cfg.URL,
			"procs_simulation": "one Go process, two NATS connections",
			"go":               runtime.Version(), "cpus": runtime.NumCPU(),
		},
		Metrics: metrics,
	}, nil
}

func throughput(cfg config, logw io.Writer) (*result, error) {
	count := cfg.Count
	if count <= 0 {
		count = 200000
		if cfg.Size >= 16384 {
			count = 20000
		}
	}
	subject := "bench.throughput." + nats.NewInbox()[len(nats.InboxPrefix):]
	nc, err := connect(cfg.URL, "rawnats-throughput")
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", cfg.URL, err)
	}
	defer nc.Close()
	var received atomic.Int64
	var bytesIn atomic.Int64
	done := make(chan time.Time, 1)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		bytesIn.Add(int64(len(m.Data)))
		if received.Add(1) == int64(count) {
			done <- time.Now()
		}
	})
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "rawnats: throughput: %d messages of %d B on one connection\n", count, cfg.Size)
	payload := make([]byte, cfg.Size)
	start := time.Now()
	for i := 0; i < count; i++ {
		if err := nc.Publish(subject, payload); err != nil {
			return nil, fmt.Errorf("publish %d: %w", i, err)
		}
	}
	if err := nc.Flush(); err != nil {
		return nil, err
	}
	timedOut := false
	end := time.Now()
	select {
	case end = <-done:
	case <-time.After(cfg.Timeout):
		timedOut = true
		fmt.Fprintf(logw, "rawnats: timed out with %d of %d received\n", received.Load(), count)
	}
	elapsed := end.Sub(start).Seconds()
	got := received.Load()
	dropped, _ := sub.Dropped()
	metrics := map[string]any{
		"messages":       got,
		"expected":       count,
		"dropped":        dropped,
		"timed_out":      timedOut,
		"duration_s":     round3(elapsed),
		"messages_per_s": math.Round(float64(got) / elapsed),
		"mb_per_s":       round3(float64(bytesIn.Load()) / elapsed / 1e6),
	}
	fmt.Fprintf(logw, "rawnats: %d B: %.0f messages/s, %.1f MB/s\n", cfg.Size, metrics["messages_per_s"], metrics["mb_per_s"])
	return &result{
		Scenario: "throughput",
		Layer:    "raw",
		Params: map[string]any{
			"size": cfg.Size, "count": count, "nats": cfg.URL,
			"procs_simulation": "one Go process, one NATS connection publishing to its own subscription",
			"go":               runtime.Version(), "cpus": runtime.NumCPU(),
		},
		Metrics: metrics,
	}, nil
}
