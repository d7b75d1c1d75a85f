package main

import (
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"
)

// childEnv marks a run of this test binary made by runInChild: the test it names reports and
// returns instead of spawning again.
const childEnv = "CN_RUNTIME_TEST_CHILD"

// runInChild runs test in a fresh process of this binary with the extra environment, and
// returns what it printed after "report:".
func runInChild(t *testing.T, test string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), append(env, childEnv+"=1")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a child with %v: %v\n%s", test, env, err, out)
	}
	_, report, found := strings.Cut(string(out), "report:")
	if !found {
		t.Fatalf("%s in a child with %v reported nothing:\n%s", test, env, out)
	}
	report, _, _ = strings.Cut(report, "\n")
	return report
}

func readMetric(name string) uint64 {
	sample := []metrics.Sample{{Name: name}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
}

var garbageSink []byte

// collectionsDuring counts the collections that finish while n bytes of garbage are allocated
// in 1 KB pieces, as a burst of small messages allocates.
func collectionsDuring(n int) uint64 {
	before := readMetric("/gc/cycles/total:gc-cycles")
	for range n / 1024 {
		garbageSink = make([]byte, 1024)
	}
	return readMetric("/gc/cycles/total:gc-cycles") - before
}

// collectedGoal collects, gives the finalizer goroutine a moment to retune the collector from
// the live heap, and returns the live heap and the heap goal of the next collection.
func collectedGoal() (live, goal uint64) {
	runtime.GC()
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	return readMetric("/gc/heap/live:bytes"), readMetric("/gc/heap/goal:bytes")
}

// A host thread entering the library finds a P while the library's goroutines hold one per CPU:
// the runtime has spareProcs more than its default, unless GOMAXPROCS says otherwise.
func TestHostThreadsHaveSpareProcs(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		println("report:" + strconv.Itoa(runtime.GOMAXPROCS(0)))
		return
	}
	if os.Getenv("GOMAXPROCS") == "" {
		got := runtime.GOMAXPROCS(0)
		runtime.SetDefaultGOMAXPROCS()
		standard := runtime.GOMAXPROCS(got)
		if got != standard+spareProcs {
			t.Errorf("GOMAXPROCS is %d, want the runtime's %d + %d spare", got, standard, spareProcs)
		}
	}
	if got := runInChild(t, "TestHostThreadsHaveSpareProcs", "GOMAXPROCS=1"); got != "1" {
		t.Errorf("with GOMAXPROCS=1 in the environment the library set %s", got)
	}
}

// After a collection over a small live heap, the next one comes gcFloorBytes later (the
// runtime's default: 4 MB later), and collections still come. With GOGC in the environment the
// runtime's own rule applies.
func TestCollectionsWaitForTheFloor(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		_, goal := collectedGoal()
		println("report:" + strconv.FormatUint(goal, 10))
		return
	}
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set in the environment: the library leaves the collector alone")
	}
	live, goal := collectedGoal()
	if want := live + gcFloorBytes; live < gcFloorBytes && goal < want-want/50 {
		t.Errorf("the next collection over a live heap of %d bytes comes at %d, want %d", live, goal, want)
	}
	if n := collectionsDuring(64 << 20); n == 0 {
		t.Errorf("64 MB of garbage brought no collection: the collector stopped")
	}
	childGoal := runInChild(t, "TestCollectionsWaitForTheFloor", "GOGC=100")
	if goal, err := strconv.ParseUint(childGoal, 10, 64); err != nil || goal >= gcFloorBytes {
		t.Errorf("with GOGC=100 in the environment the next collection comes at %s bytes: the library tuned it", childGoal)
	}
}

// The percentage puts the next collection at live + gcFloorBytes, and is the runtime's own from
// a live heap of gcFloorBytes up.
func TestGCPercentForPutsTheGoalAtTheFloor(t *testing.T) {
	goal := func(live uint64, percent int) uint64 { // the runtime's heap goal for this GOGC
		return max(live+live*uint64(percent)/100, heapMinimum*uint64(percent)/100)
	}
	for _, live := range []uint64{0, 64 << 10, 1 << 20, 3 << 20, heapMinimum, 8 << 20, gcFloorBytes - 1} {
		got := goal(live, gcPercentFor(live))
		if want := live + gcFloorBytes; got < want-want/50 || got > want+want/50 { // GOGC is a whole percent
			t.Errorf("a live heap of %d bytes: goal %d, want about %d", live, got, want)
		}
	}
	for _, live := range []uint64{gcFloorBytes, 64 << 20} {
		if got := gcPercentFor(live); got != 100 {
			t.Errorf("a live heap of %d bytes: GOGC %d, want the runtime's 100", live, got)
		}
	}
}

// A host that calls from its main thread where /proc is missing is told why its calls are slow.
func TestStackBoundsWarningNamesTheCause(t *testing.T) {
	if !withGlibc {
		if got := stackBoundsWarning("/no/such/maps"); got != "" {
			t.Fatalf("stackBoundsWarning on %s without glibc = %q, want no warning", runtime.GOOS, got)
		}
		return
	}
	if got := stackBoundsWarning(mainThreadMaps); got != "" {
		t.Fatalf("stackBoundsWarning(%s) = %q with /proc mounted, want no warning", mainThreadMaps, got)
	}
	got := stackBoundsWarning("/no/such/maps")
	for _, want := range []string{"main thread", "/no/such/maps", "no such file", "mount /proc"} {
		if !strings.Contains(got, want) {
			t.Errorf("stackBoundsWarning without the file = %q, want it to say %q", got, want)
		}
	}
}
