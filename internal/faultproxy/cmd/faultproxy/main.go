// Command faultproxy runs a fault proxy (package faultproxy) that a test in another language
// drives over stdin, one command a line:
//
//	pass | delay <ms> | stop up|down|both | cut | refuse on|off | conns | quit
//
// It prints "listening 127.0.0.1:<port>" once, then answers every command with "ok" ("ok
// <open> <accepted>" for conns) or "error: <why>". EOF on stdin is quit. The target must be a
// loopback address: the proxy is a test tool, never a relay to other hosts.
//
// Usage:
//
//	faultproxy -target 127.0.0.1:4222
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
)

func main() {
	target := flag.String("target", "", "host:port or nats://host:port of the server; loopback only")
	flag.Parse()
	err := checkLoopback(*target)
	if err == nil && flag.NArg() > 0 {
		err = fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultproxy:", err)
		os.Exit(2)
	}
	p, err := faultproxy.Start(*target)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Stdout is unbuffered in Go, so every line reaches the driving test as it is printed.
	fmt.Println("listening", p.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		reply, quit := command(p, in.Text())
		fmt.Println(reply)
		if quit {
			break
		}
	}
	_ = p.Close()
}

// checkLoopback accepts a target on 127.0.0.0/8, ::1 or localhost only.
func checkLoopback(target string) error {
	if target == "" {
		return errors.New("-target is required")
	}
	host, _, err := net.SplitHostPort(strings.TrimPrefix(target, "nats://"))
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("target %q is not a loopback address", target)
	}
	return nil
}

// arity is how many arguments each command takes.
var arity = map[string]int{"pass": 0, "delay": 1, "stop": 1, "cut": 0, "refuse": 1, "conns": 0, "quit": 0}

var directions = map[string]faultproxy.Direction{"up": faultproxy.Up, "down": faultproxy.Down, "both": faultproxy.Both}

// command runs one command line and returns its reply, and whether it was quit.
func command(p *faultproxy.Proxy, line string) (reply string, quit bool) {
	words := strings.Fields(line)
	if len(words) == 0 {
		return "error: empty command", false
	}
	name, args := words[0], words[1:]
	want, known := arity[name]
	switch {
	case !known:
		return fmt.Sprintf("error: unknown command %q", name), false
	case len(args) != want:
		return fmt.Sprintf("error: %s takes %d argument(s)", name, want), false
	}
	switch name {
	case "pass":
		p.Pass()
	case "delay":
		ms, err := strconv.Atoi(args[0])
		if err != nil || ms < 0 {
			return fmt.Sprintf("error: delay %q: want milliseconds, 0 or more", args[0]), false
		}
		p.Delay(time.Duration(ms) * time.Millisecond)
	case "stop":
		dir, ok := directions[args[0]]
		if !ok {
			return fmt.Sprintf("error: stop %q: want up, down or both", args[0]), false
		}
		p.Stop(dir)
	case "cut":
		p.Cut()
	case "refuse":
		if args[0] != "on" && args[0] != "off" {
			return fmt.Sprintf("error: refuse %q: want on or off", args[0]), false
		}
		p.Refuse(args[0] == "on")
	case "conns":
		return fmt.Sprintf("ok %d %d", p.Conns(), p.Accepted()), false
	case "quit":
		return "ok", true
	}
	return "ok", false
}
