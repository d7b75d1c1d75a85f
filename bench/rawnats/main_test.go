package main

import (
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func TestPercentile(t *testing.T) {
	if got := percentile(nil, 50); got != 0 {
		t.Fatalf("empty: got %v, want 0", got)
	}
	values := make([]float64, 100)
	for i := range values {
		values[i] = float64(i + 1) // 1..100
	}
	for _, c := range []struct{ p, want float64 }{
		{0, 1}, {1, 1}, {50, 50}, {95, 95}, {99, 99}, {99.5, 100}, {100, 100}, {150, 100},
	} {
		if got := percentile(values, c.p); got != c.want {
			t.Errorf("p%v of 1..100: got %v, want %v", c.p, got, c.want)
		}
	}
	one := []float64{7}
	for _, p := range []float64{0, 50, 99, 100} {
		if got := percentile(one, p); got != 7 {
			t.Errorf("p%v of [7]: got %v, want 7", p, got)
		}
	}
	three := []float64{1, 2, 3}
	if got := percentile(three, 50); got != 2 {
		t.Errorf("p50 of 1,2,3: got %v, want 2", got)
	}
}

func startServer(t *testing.T) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(srv.Shutdown)
	return srv.ClientURL()
}

func TestScenarios(t *testing.T) {
	url := startServer(t)
	cases := []struct {
		cfg      config
		expected int64
	}{
		{config{Scenario: "fanout", URL: url, Members: 21, Procs: 2, Messages: 5, Gap: time.Millisecond, Size: 100}, 105},
		{config{Scenario: "saturation", URL: url, Members: 10, Procs: 3, Messages: 20, Gap: time.Second, Size: 4}, 200},
		{config{Scenario: "pingpong", URL: url, Roundtrips: 50, Size: 100}, 0},
		{config{Scenario: "throughput", URL: url, Size: 65536, Count: 200}, 200},
	}
	for _, c := range cases {
		t.Run(c.cfg.Scenario, func(t *testing.T) {
			c.cfg.Timeout = 10 * time.Second
			res, err := run(c.cfg, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if res.Scenario != c.cfg.Scenario || res.Layer != "raw" {
				t.Fatalf("scenario/layer: %q %q", res.Scenario, res.Layer)
			}
			// The contract: one JSON object with these four keys.
			raw, err := json.Marshal(res)
			if err != nil {
				t.Fatal(err)
			}
			var back map[string]any
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			for _, key := range []string{"scenario", "layer", "params", "metrics"} {
				if _, ok := back[key]; !ok {
					t.Fatalf("no %q in %s", key, raw)
				}
			}
			m := res.Metrics
			switch c.cfg.Scenario {
			case "fanout", "saturation":
				if m["deliveries"] != c.expected || m["expected"] != c.expected || m["timed_out"] != false {
					t.Fatalf("deliveries: %v", m)
				}
				if res.Params["gap_ms"] != float64(c.cfg.Gap)/1e6 && c.cfg.Scenario == "fanout" {
					t.Fatalf("gap: %v", res.Params)
				}
				if c.cfg.Scenario == "saturation" && res.Params["gap_ms"] != 0.0 {
					t.Fatalf("saturation must not wait between publishes: %v", res.Params)
				}
				p50, p99, max := m["latency_p50_ms"].(float64), m["latency_p99_ms"].(float64), m["latency_max_ms"].(float64)
				if p50 <= 0 || p50 > p99 || p99 > max {
					t.Fatalf("latencies out of order: %v", m)
				}
				if m["deliveries_per_s"].(float64) <= 0 {
					t.Fatalf("rate: %v", m)
				}
			case "pingpong":
				if m["roundtrips"] != 50 || m["rtt_p50_us"].(float64) <= 0 {
					t.Fatalf("pingpong: %v", m)
				}
			case "throughput":
				if m["messages"] != c.expected || m["messages_per_s"].(float64) <= 0 {
					t.Fatalf("throughput: %v", m)
				}
			}
		})
	}
	if _, err := run(config{Scenario: "nope", URL: url}, io.Discard); err == nil {
		t.Fatal("an unknown scenario must be an error")
	}
}
