package bench

import (
	"bufio"
	"bytes"
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text format: a metric name, its labels and
// its value. Only what the benchmark reads is parsed (counters and gauges); the
// format's escapes inside label values are kept as written.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseSamples reads the Prometheus text exposition format. It is deliberately small:
// the API server's and etcd's /metrics are well formed, and the benchmark only needs
// a few counters from them.
func parseSamples(text []byte, keep func(name string) bool) []sample {
	var out []sample
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if !keep(name) {
			continue
		}
		s := sample{name: name, labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			s.labels = parseLabels(rest[1:end])
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// parseLabels splits `a="x",b="y"` into a map.
func parseLabels(s string) map[string]string {
	labels := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return labels
		}
		key := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(s); i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				val.WriteByte(s[i])
				continue
			}
			if s[i] == '"' {
				break
			}
			val.WriteByte(s[i])
		}
		labels[key] = val.String()
		s = strings.TrimPrefix(s[min(i+1, len(s)):], ",")
	}
	return labels
}

// sum adds the values of every sample named name whose labels pass match.
func sum(samples []sample, name string, match func(map[string]string) bool) float64 {
	total := 0.0
	for _, s := range samples {
		if s.name == name && (match == nil || match(s.labels)) {
			total += s.value
		}
	}
	return total
}
