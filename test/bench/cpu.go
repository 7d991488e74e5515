package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux this runs on (it is fixed by the ABI, not by CONFIG_HZ).
const clockTicks = 100

// cpuSeconds is the CPU time (user + system) every process of this run has used so
// far, by what it is: "kube-apiserver", "etcd", "manager", "postgres" and "bench"
// (this process: senders, watches, the fake billing provider). A process's reaped
// children count for it (PostgreSQL's backends for the postmaster), except this
// process's own (go build). roots are processes of this run that are not its
// descendants, by name (the postmaster, which pg_ctl starts detached); their
// descendants count for them. Processes started by anyone else are not counted: on a
// shared machine the figures stay this run's.
func cpuSeconds(roots map[int]string) (map[string]float64, error) {
	self := os.Getpid()
	type proc struct {
		ppid  int
		name  string
		ticks float64
	}
	procs := map[int]proc{}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17); comm may hold spaces.
		end := bytes.LastIndexByte(raw, ')')
		start := bytes.IndexByte(raw, '(')
		if end < 0 || start < 0 {
			continue
		}
		f := strings.Fields(string(raw[end+1:]))
		if len(f) < 15 {
			continue
		}
		num := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v }
		ppid, _ := strconv.Atoi(f[1])
		ticks := num(11) + num(12)
		if pid != self {
			ticks += num(13) + num(14)
		}
		procs[pid] = proc{ppid: ppid, name: string(raw[start+1 : end]), ticks: ticks}
	}
	// nameOf is the group pid counts for: its own root's name, or the name of its
	// ancestor that is a direct child of this process; "" for anyone else's.
	nameOf := func(pid int) string {
		for cur, hops := pid, 0; hops < 64; hops++ {
			if cur == self {
				return "bench"
			}
			if name, ok := roots[cur]; ok {
				return name
			}
			p, ok := procs[cur]
			if !ok {
				return ""
			}
			if p.ppid == self {
				return group(p.name)
			}
			cur = p.ppid
		}
		return ""
	}
	out := map[string]float64{}
	for pid, p := range procs {
		if name := nameOf(pid); name != "" {
			out[name] += p.ticks / clockTicks
		}
	}
	return out, nil
}

// group is what a process of this run is counted as, by its command name; "" for
// what is not part of the pipeline (the go build of the manager).
func group(comm string) string {
	for _, g := range []string{"kube-apiserver", "etcd", "manager", "postgres"} {
		if strings.HasPrefix(comm, g) {
			return g
		}
	}
	return ""
}

// cpuPerEvent is the CPU time each process used between two readings, per event.
func cpuPerEvent(before, after map[string]float64, events int) map[string]float64 {
	if events <= 0 || before == nil || after == nil {
		return nil
	}
	out := map[string]float64{}
	for name, v := range after {
		out[name] = round((v-before[name])/float64(events)*1000, 2) // ms
	}
	return out
}

// cpuTotal adds the pipeline's processes (everything but the bench's own senders and
// fakes), in ms per event.
func cpuTotal(ms map[string]float64) float64 {
	t := 0.0
	for name, v := range ms {
		if name != "bench" {
			t += v
		}
	}
	return round(t, 2)
}

// cpuLine reads "41.2 ms (kube-apiserver 20.1, etcd 5.2, manager 12.0, postgres 3.9; bench 2.0)".
func cpuLine(ms map[string]float64) string {
	if ms == nil {
		return "-"
	}
	var parts []string
	for _, name := range []string{"kube-apiserver", "etcd", "manager", "postgres"} {
		if v, ok := ms[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f", name, v))
		}
	}
	return fmt.Sprintf("%.1f ms (%s; bench %.1f)", cpuTotal(ms), strings.Join(parts, ", "), ms["bench"])
}
