package bench

import (
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestCPUSecondsCountsARootAndItsChildren: a process named as a root is counted under
// its name, with the children it starts; an unrelated process is not.
func TestCPUSecondsCountsARootAndItsChildren(t *testing.T) {
	busy := exec.Command("sh", "-c", "sh -c 'while :; do :; done' & wait")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = exec.Command("pkill", "-P", itoa(busy.Process.Pid)).Run()
		_ = busy.Process.Kill()
		_ = busy.Wait()
	}()
	roots := map[int]string{busy.Process.Pid: "busy"}
	before, err := cpuSeconds(roots)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	after, err := cpuSeconds(roots)
	if err != nil {
		t.Fatal(err)
	}
	// The loop runs in the grandchild: only counted through its root.
	if got := after["busy"] - before["busy"]; got < 0.2 {
		t.Fatalf("the busy child's CPU was not counted under its root: %.2f s in 0.7 s", got)
	}
	if _, ok := after["sh"]; ok {
		t.Fatalf("a process was counted under its own name instead of its root's: %v", after)
	}
	ms := cpuPerEvent(map[string]float64{"etcd": 1, "bench": 1}, map[string]float64{"etcd": 3, "bench": 5}, 1000)
	if ms["etcd"] != 2 || cpuTotal(ms) != 2 {
		t.Fatalf("per event: %v, total %.2f; want etcd 2 ms and the bench left out of the total", ms, cpuTotal(ms))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
