package lagobilling_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
)

// An undated event carries its first attempt's time, and a retry may be accepted up to
// the key window (24 h by default) later: the pass, listing what Lago created since,
// must still see it although its timestamp is long before since.
func TestListSeesALateRetryOfAnUndatedEvent(t *testing.T) {
	fake, c := setup(t)
	now := time.Now().UTC().Truncate(time.Second)
	since := now.Add(-10 * time.Minute)
	r := fake.Charge("stl_late")
	fake.Store(fakelago.Event{TransactionID: r.IdempotencyKey, ExternalSubscriptionID: r.Customer, Code: "llm_tokens",
		Timestamp: since.Add(-20 * time.Hour), CreatedAt: now.Add(-time.Minute),
		Properties: map[string]json.RawMessage{"tokens": json.RawMessage(`"3"`), "settlement_key": json.RawMessage(`"` + r.SettlementKey + `"`)}})
	var keys []string
	for cursor := ""; ; {
		items, next, err := c.List(context.Background(), since, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range items {
			keys = append(keys, it.IdempotencyKey)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	for _, k := range keys {
		if k == r.IdempotencyKey {
			return
		}
	}
	t.Fatalf("an event accepted after since, dated 20 h before it, was not listed (listed %v)", keys)
}

// What the adapter refuses before sending anything is Local: provider health must not
// read an unmapped meter or a reversal Lago cannot take as an unreachable endpoint.
func TestRefusalsBeforeSendingAreLocal(t *testing.T) {
	fake, c := setup(t)
	unmapped := fake.Charge("stl_unmapped")
	unmapped.Usage.Meter = "gpu-seconds"
	void := fake.Charge("stl_void")
	void.Type, void.Reverses = billing.TypeVoid, "stl_unmapped"
	for name, r := range map[string]billing.Request{"unmapped meter": unmapped, "void": void} {
		_, err := c.Submit(context.Background(), r)
		if e := class(t, err); e.Class != billing.Terminal || !e.Local {
			t.Errorf("%s: %s local=%v: %v", name, e.Class, e.Local, err)
		}
	}
	if n := len(fake.Requests()); n != 0 {
		t.Fatalf("%d requests reached Lago", n)
	}
}
