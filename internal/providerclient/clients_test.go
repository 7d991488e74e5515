package providerclient

import (
	"net/http"
	"testing"

	"github.com/settlement-operator/settlement-operator/internal/billing"
)

func TestObservedClientForgetsTheCredentialOnRejection(t *testing.T) {
	forgot := 0
	c := observedClient{rejected: func() { forgot++ }}
	c.observe(&billing.Error{Status: http.StatusUnauthorized})
	c.observe(&billing.Error{Status: http.StatusForbidden})
	c.observe(&billing.Error{Status: http.StatusServiceUnavailable})
	c.observe(nil)
	if forgot != 2 {
		t.Fatalf("forgot %d times, want 2 (401 and 403 only)", forgot)
	}
}
