package bench

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// machine describes the host from /proc (Linux); fields it cannot read stay empty.
func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version(),
		LoadAverageStart: loadAverage()}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	if kb, err := procField("/proc/meminfo", "MemTotal"); err == nil {
		m.MemoryBytes = kb << 10
	}
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// procField reads a "Name:   123 kB" line of a /proc status-like file, in kB.
func procField(path, name string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != name {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			break
		}
		return strconv.ParseInt(fields[0], 10, 64)
	}
	return 0, fmt.Errorf("%s: no %s", path, name)
}

// rss returns a process's resident set size and its peak (VmRSS, VmHWM) in bytes.
func rss(pid int) (cur, peak int64, err error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	kb, err := procField(path, "VmRSS")
	if err != nil {
		return 0, 0, err
	}
	hwm, err := procField(path, "VmHWM")
	if err != nil {
		return 0, 0, err
	}
	return kb << 10, hwm << 10, nil
}
