package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Profile is a CPU profile of one process (the manager, the API server) over one
// phase, summarized by `go tool pprof -top`: where its CPU went while the pipeline
// was busy.
type Profile struct {
	Process string `json:"process"`
	// Phase names what was running; Seconds is how long the profile sampled.
	Phase   string  `json:"phase"`
	Seconds float64 `json:"seconds"`
	// SampledCPUSeconds is the CPU time the samples add up to (of Seconds × cores).
	SampledCPUSeconds float64 `json:"sampledCPUSeconds"`
	// Flat are the ten functions with the most CPU of their own; Cumulative the ten
	// with the most CPU in them and what they call (where the time is spent, seen
	// from the operator's own code).
	Flat       []ProfileEntry `json:"flat"`
	Cumulative []ProfileEntry `json:"cumulative"`
	// File is the raw profile (`go tool pprof <manager binary> <file>`), written next
	// to the results (git ignores it).
	File string `json:"file"`
}

// ProfileEntry is one row of `go tool pprof -top`.
type ProfileEntry struct {
	Function   string  `json:"function"`
	FlatPct    float64 `json:"flatPercent"`
	CumPct     float64 `json:"cumulativePercent"`
	FlatSecond float64 `json:"flatSeconds"`
	CumSecond  float64 `json:"cumulativeSeconds"`
}

// startCPUProfile starts sampling the manager's CPU for d (its --pprof-bind-address
// endpoint) and returns a function that waits for the profile and summarizes it.
// A failure is reported by the returned function, never fatal to the run.
func (o *operator) startCPUProfile(ctx context.Context, phase, dir string, d time.Duration) func() (*Profile, error) {
	return startProfile(ctx, http.DefaultClient, o.PprofURL, o.bin, phase, "manager", dir, d)
}

// startAPIServerProfile samples the API server's CPU (its /debug/pprof, which
// envtest's kube-apiserver serves to the admin user) for d, alongside the manager's:
// on one machine they share the cores, and the API server is where a write costs.
func (b *run) startAPIServerProfile(ctx context.Context, phase string, d time.Duration) func() (*Profile, error) {
	hc, err := rest.HTTPClientFor(b.restCfg)
	if err != nil {
		return func() (*Profile, error) { return nil, err }
	}
	// The profile carries its symbols: no binary needed.
	return startProfile(ctx, hc, strings.TrimSuffix(b.restCfg.Host, "/"), "", phase, "kube-apiserver", b.profileDir(), d)
}

func startProfile(ctx context.Context, hc *http.Client, base, bin, phase, process, dir string, d time.Duration) func() (*Profile, error) {
	type result struct {
		data []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		secs := max(1, int(d.Seconds()))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), nil)
		if err != nil {
			ch <- result{err: err}
			return
		}
		c := *hc
		c.Timeout = d + time.Minute
		resp, err := c.Do(req)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("pprof answered %s: %.200s", resp.Status, data)
		}
		ch <- result{data: data, err: err}
	}()
	return func() (*Profile, error) {
		r := <-ch
		if r.err != nil {
			return nil, fmt.Errorf("CPU profile of %s: %w", phase, r.err)
		}
		file := filepath.Join(dir, process+"-cpu-"+strings.ReplaceAll(phase, " ", "-")+".pprof")
		if err := os.WriteFile(file, r.data, 0o600); err != nil {
			return nil, err
		}
		p := &Profile{Process: process, Phase: phase, Seconds: d.Seconds(), File: file}
		var err error
		if p.Flat, p.SampledCPUSeconds, err = pprofTop(ctx, bin, []string{file}, false); err != nil {
			return nil, err
		}
		if p.Cumulative, _, err = pprofTop(ctx, bin, []string{file}, true); err != nil {
			return nil, err
		}
		return p, nil
	}
}

// profileSelf profiles this process's CPU (the in-process receiver of items 1-2, and
// its senders) into file in the profile directory until the returned function is
// called; the file is added to files. Off when profiling is.
func (b *run) profileSelf(file string, files *[]string) func() {
	if b.cfg.ProfileSeconds <= 0 {
		return func() {}
	}
	path := filepath.Join(b.profileDir(), file)
	f, err := os.Create(path)
	if err != nil {
		b.res.Notes = append(b.res.Notes, "receiver profile: "+err.Error())
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		b.res.Notes = append(b.res.Notes, "receiver profile: "+err.Error())
		return func() {}
	}
	*files = append(*files, path)
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// summarizeSelfProfile adds the receiver's profile over the accepted deliveries
// (every round's, merged), focused on the receiver's own code: where an accepted
// delivery's time goes beyond the create (the senders share the process).
func (b *run) summarizeSelfProfile(ctx context.Context, files []string, d time.Duration) {
	p := &Profile{Process: "receiver (in the benchmark's process)", Phase: "accepted deliveries", Seconds: round(d.Seconds(), 1),
		File: strings.Join(files, " ")}
	var err error
	focus := "-focus=settlement-operator/internal/receiver"
	if p.Flat, p.SampledCPUSeconds, err = pprofTop(ctx, "", files, false, focus); err == nil {
		p.Cumulative, _, err = pprofTop(ctx, "", files, true, focus)
	}
	if err != nil {
		b.res.Notes = append(b.res.Notes, "receiver profile: "+err.Error())
		return
	}
	b.res.Profiles = append(b.res.Profiles, *p)
}

// pprofTop runs `go tool pprof -top` on profiles (merged) and parses its ten rows,
// sorted by flat or cumulative time, and the total sampled CPU seconds.
func pprofTop(ctx context.Context, bin string, files []string, cum bool, extra ...string) ([]ProfileEntry, float64, error) {
	args := append([]string{"tool", "pprof", "-top", "-nodecount=10", "-unit=s"}, extra...)
	if cum {
		args = append(args, "-cum")
	}
	if bin != "" {
		args = append(args, bin)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, files...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, 0, fmt.Errorf("go tool pprof: %w: %s", err, stderr.String())
	}
	return parsePprofTop(out)
}

// parsePprofTop reads `go tool pprof -top -unit=s` output: a header with "Total
// samples = 12.3s" and rows "flat flat% sum% cum cum% function".
func parsePprofTop(out []byte) ([]ProfileEntry, float64, error) {
	var entries []ProfileEntry
	total := 0.0
	rows := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "Total samples = "); i >= 0 && total == 0 {
			f := strings.Fields(line[i+len("Total samples = "):])
			if len(f) > 0 {
				total, _ = strconv.ParseFloat(strings.TrimSuffix(f[0], "s"), 64)
			}
			continue
		}
		if strings.HasPrefix(line, "flat") {
			rows = true
			continue
		}
		if !rows || line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		num := func(s string) float64 {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSuffix(s, "%"), "s"), 64)
			return v
		}
		entries = append(entries, ProfileEntry{FlatSecond: num(f[0]), FlatPct: num(f[1]), CumSecond: num(f[3]),
			CumPct: num(f[4]), Function: strings.Join(f[5:], " ")})
	}
	if len(entries) == 0 {
		return nil, 0, fmt.Errorf("go tool pprof printed no rows:\n%s", out)
	}
	return entries, total, nil
}
