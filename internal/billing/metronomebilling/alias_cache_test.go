package metronomebilling

import (
	"fmt"
	"testing"
	"time"
)

// The alias cache holds at most aliasCacheSize aliases, each for aliasTTL: an alias
// moved to another customer in Metronome is read again within the hour.
func TestAliasCacheIsBounded(t *testing.T) {
	var a aliasCache
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range aliasCacheSize + 10 {
		a.put(fmt.Sprintf("alias-%d", i), fmt.Sprintf("id-%d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(a.entries); n != aliasCacheSize {
		t.Fatalf("%d aliases held, want at most %d", n, aliasCacheSize)
	}
	if _, ok := a.get("alias-0", t0.Add(2*time.Second)); ok {
		t.Fatal("the oldest alias is dropped first")
	}
	newest := fmt.Sprintf("alias-%d", aliasCacheSize+9)
	if id, ok := a.get(newest, t0.Add(2*time.Second)); !ok || id != fmt.Sprintf("id-%d", aliasCacheSize+9) {
		t.Fatalf("the newest alias is held: %q %v", id, ok)
	}
	if _, ok := a.get(newest, t0.Add(aliasTTL+time.Minute)); ok {
		t.Fatal("an alias is read again after aliasTTL")
	}
}
