package controllers

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// durationOr returns d's value, or def when d is unset or zero (the API server
// defaults these fields, but a zero must never mean "retry in a tight loop").
func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil || d.Duration <= 0 {
		return def
	}
	return d.Duration
}
