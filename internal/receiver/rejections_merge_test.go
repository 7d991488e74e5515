package receiver

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// TestMergeRejection: how a flush folds pending refusals into status.lastRejection.
func TestMergeRejection(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	signedMissing := func(ago time.Duration, count int64) *hooksv1alpha1.DeliveryRejection {
		first := metav1.NewTime(now.Add(-time.Hour))
		return &hooksv1alpha1.DeliveryRejection{Reason: hooksv1alpha1.RejectionMissingField, Path: ".data.customer",
			Signed: true, Count: count, FirstTime: &first, LastTime: metav1.NewTime(now.Add(-ago))}
	}
	pend := func(r *rejection, count int64, ago time.Duration) map[pendingKey]*pendingRejection {
		return map[pendingKey]*pendingRejection{{r.reason, r.path}: {r: *r, count: count, first: now.Add(-ago), last: now.Add(-ago)}}
	}
	missing := &rejection{reason: hooksv1alpha1.RejectionMissingField, path: ".data.customer", message: "customer is missing", signed: true}
	otherPath := &rejection{reason: hooksv1alpha1.RejectionMissingField, path: ".data.job_id", message: "job ID is missing", signed: true}

	tests := []struct {
		name        string
		cur         *hooksv1alpha1.DeliveryRejection
		pending     map[pendingKey]*pendingRejection
		wantChanged bool
		wantReason  string
		wantPath    string
		wantCount   int64
	}{
		{"first rejection", nil, pend(rejectSignature, 3, 0), true, hooksv1alpha1.RejectionInvalidSignature, "", 3},
		{"same reason and path adds up", signedMissing(time.Minute, 5), pend(missing, 2, 0), true, hooksv1alpha1.RejectionMissingField, ".data.customer", 7},
		{"another path starts over", signedMissing(time.Minute, 5), pend(otherPath, 2, 0), true, hooksv1alpha1.RejectionMissingField, ".data.job_id", 2},
		{"unsigned does not mask a recent signed one", signedMissing(9*time.Minute, 5), pend(rejectSignature, 50, 0), false, hooksv1alpha1.RejectionMissingField, ".data.customer", 5},
		{"unsigned replaces a signed one past the window", signedMissing(11*time.Minute, 5), pend(rejectSignature, 50, 0), true, hooksv1alpha1.RejectionInvalidSignature, "", 50},
		{"signed wins over a later unsigned in one flush", nil, map[pendingKey]*pendingRejection{
			{missing.reason, missing.path}:                 {r: *missing, count: 1, first: now.Add(-time.Minute), last: now.Add(-time.Minute)},
			{rejectSignature.reason, rejectSignature.path}: {r: *rejectSignature, count: 9, first: now, last: now},
		}, true, hooksv1alpha1.RejectionMissingField, ".data.customer", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, changed := mergeRejection(tt.cur, tt.pending, now)
			if changed != tt.wantChanged || got.Reason != tt.wantReason || got.Path != tt.wantPath || got.Count != tt.wantCount {
				t.Fatalf("got changed=%v %s %q count %d; want changed=%v %s %q count %d",
					changed, got.Reason, got.Path, got.Count, tt.wantChanged, tt.wantReason, tt.wantPath, tt.wantCount)
			}
		})
	}
}
