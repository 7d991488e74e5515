package billing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

// The HTTP contract's amount is ISO 4217 minor units, passed through unchanged whatever
// the currency (README, "the HTTP contract"): converting to another unit is the
// backend's business, and nothing is refused for its currency here.
func TestHTTPAmountsAreISOMinorUnitsUnchanged(t *testing.T) {
	var got struct {
		Amount struct {
			Minor    int64  `json:"minor"`
			Currency string `json:"currency"`
		} `json:"amount"`
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Errorf("decode: %v", err)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"rec_1","status":"settled"}`))
	}))
	defer srv.Close()
	c := newClient(t, srv.URL, 5*time.Second)
	for _, a := range []billing.Amount{{Minor: 5, Currency: "ISK"}, {Minor: 1234, Currency: "KWD"}, {Minor: 150, Currency: "MGA"},
		{Minor: 500, Currency: "JPY"}, {Minor: 1250, Currency: "USD"}} {
		r := chargeRequest(1)
		r.Usage, r.Amount = nil, &a
		rec, err := c.Submit(context.Background(), r)
		if err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		if got.Amount.Minor != a.Minor || got.Amount.Currency != a.Currency {
			t.Fatalf("sent %+v for %+v", got.Amount, a)
		}
		if rec.Amount == nil || *rec.Amount != a {
			t.Fatalf("record amount %+v for %+v", rec.Amount, a)
		}
	}
}
