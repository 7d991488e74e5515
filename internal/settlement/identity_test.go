package settlement_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/identity"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// operatorMade is the settlement the WebhookEvent controller creates for key in ns.
func operatorMade(ns, key, jobID string) *hooksv1alpha1.BillingSettlement {
	ev := &hooksv1alpha1.WebhookEvent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "inference-e1"},
		Spec: hooksv1alpha1.WebhookEventSpec{Provider: "inference", EventID: "e1"}}
	return settlement.New(ev, &hooksv1alpha1.SettlementFacts{SettlementKey: key, JobID: jobID,
		BillingProviderRef: "billing", Customer: "cus_1", Amount: &hooksv1alpha1.Amount{Minor: 1, Currency: "USD"}})
}

func TestValidateSettlementIdentity(t *testing.T) {
	jobKey := identity.JobSettlementKey("team-a", "inference", "job-1")
	fieldsKey := identity.FieldsSettlementKey("team-a", "inference", "inv-1", "line-2")
	legacyKey := identity.DefaultSettlementKey("inference", "job-1")
	refundKey := "refund/" + legacyKey

	// legacyMade is a settlement as the operator created it before keys were namespaced.
	legacyMade := func() *hooksv1alpha1.BillingSettlement {
		bs := operatorMade("team-a", legacyKey, "job-1")
		bs.Spec.IdempotencyKey = identity.IdempotencyKey(legacyKey)
		return bs
	}
	handMade := func(idem, name string) *hooksv1alpha1.BillingSettlement {
		return &hooksv1alpha1.BillingSettlement{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
			Spec: hooksv1alpha1.BillingSettlementSpec{SettlementKey: refundKey, IdempotencyKey: idem,
				Type: hooksv1alpha1.SettlementRefund, Reverses: "x", BillingProviderRef: "billing", Customer: "c"}}
	}
	tests := []struct {
		name string
		bs   *hooksv1alpha1.BillingSettlement
		// want lists what the error must say; nil means valid.
		want []string
	}{
		{name: "a job's charge made by the operator", bs: operatorMade("team-a", jobKey, "job-1")},
		{name: "a keyFrom charge made by the operator", bs: operatorMade("team-a", fieldsKey, "")},
		{name: "a charge made before keys were namespaced", bs: legacyMade()},
		{name: "a legacy key of a stored event, charged after keys were namespaced", bs: operatorMade("team-a", legacyKey, "job-1")},
		{name: "a refund by hand, legacy derivation (as the runbook describes it)",
			bs: handMade(identity.IdempotencyKey(refundKey), identity.SettlementName("inference", refundKey))},
		{name: "a refund by hand, namespaced derivation",
			bs: handMade(identity.NamespacedIdempotencyKey("team-a", refundKey), identity.SettlementName("ops", refundKey))},

		{name: "another operation's idempotency key",
			bs:   handMade(identity.IdempotencyKey(legacyKey), identity.SettlementName("inference", refundKey)),
			want: []string{"spec.idempotencyKey is", identity.NamespacedIdempotencyKey("team-a", refundKey), identity.IdempotencyKey(refundKey)}},
		{name: "a name of another key",
			bs:   handMade(identity.IdempotencyKey(refundKey), identity.SettlementName("inference", legacyKey)),
			want: []string{"metadata.name is", identity.SettlementName("", refundKey)}},
		{name: "a name that is only the hash",
			bs:   handMade(identity.IdempotencyKey(refundKey), identity.SettlementName("", refundKey)),
			want: []string{"metadata.name is"}},
		{name: "a legacy name under another webhook provider", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := legacyMade()
			bs.Spec.WebhookProvider = "other"
			return bs
		}(), want: []string{"metadata.name is", identity.SettlementName("other", legacyKey)}},
		{name: "another tenant's structured key", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := operatorMade("team-a", jobKey, "job-1")
			bs.Namespace = "team-b"
			return bs
		}(), want: []string{`belongs to namespace "team-a", not "team-b"`, "spec.idempotencyKey is",
			identity.NamespacedIdempotencyKey("team-b", jobKey)}},
		{name: "a structured key with the legacy idempotency key", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := operatorMade("team-a", jobKey, "job-1")
			bs.Spec.IdempotencyKey = identity.IdempotencyKey(jobKey)
			return bs
		}(), want: []string{"spec.idempotencyKey is", identity.NamespacedIdempotencyKey("team-a", jobKey)}},
		{name: "a job's key on another job", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := operatorMade("team-a", jobKey, "job-1")
			bs.Spec.JobID = "job-2"
			return bs
		}(), want: []string{`spec.jobID is "job-2"`}},
		{name: "a structured key of another webhook provider", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := operatorMade("team-a", fieldsKey, "")
			bs.Spec.WebhookProvider = ""
			return bs
		}(), want: []string{`spec.webhookProvider is ""`}},
		{name: "a structured key under another name", bs: func() *hooksv1alpha1.BillingSettlement {
			bs := operatorMade("team-a", fieldsKey, "")
			bs.Name = identity.SettlementName("inference", identity.FieldsSettlementKey("team-a", "inference", "inv-1"))
			return bs
		}(), want: []string{"metadata.name is", identity.SettlementNameFor("inference", fieldsKey)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := settlement.ValidateIdentity(tt.bs)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("refused a valid settlement: %v", err)
				}
				return
			}
			if !errors.Is(err, settlement.ErrIdentity) {
				t.Fatalf("got %v, want ErrSettlementIdentity", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// The samples show settlements as they are stored: they stay valid in any namespace.
func TestSampleSettlementsHaveAValidIdentity(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "hooks_v1alpha1_billingsettlement*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no settlement samples: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var bs hooksv1alpha1.BillingSettlement
		if err := utilyaml.Unmarshal(raw, &bs); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		bs.Namespace = "default"
		if err := settlement.ValidateIdentity(&bs); err != nil {
			t.Errorf("%s: %v", filepath.Base(f), err)
		}
	}
}
