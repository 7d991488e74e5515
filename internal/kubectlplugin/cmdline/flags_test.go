package cmdline

import (
	"testing"
	"time"
)

var nov = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-01T00:00:00Z":      nov,
		"2026-11-01T01:00:00+01:00": nov,
		"2026-11-01T00:00:00.5Z":    nov.Add(500 * time.Millisecond),
		"2026-11-01":                nov,
		"24h":                       now.Add(-24 * time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"7d":                        now.Add(-7 * 24 * time.Hour),
	} {
		got, err := ParseTime("since", in, now)
		if err != nil || !got.Equal(want) || got.Location() != time.UTC {
			t.Errorf("%s: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0s", "-1h", "1w", "d", "2026-13-01", "tomorrow"} {
		if _, err := ParseTime("since", bad, now); err == nil {
			t.Errorf("%q must be refused", bad)
		}
	}
}
