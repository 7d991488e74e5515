package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// durationOr returns d's value, or def when d is unset or zero (the API server
// defaults these fields, but a zero must never mean "retry in a tight loop").
func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil || d.Duration <= 0 {
		return def
	}
	return d.Duration
}

// readSecretKey reads one key of a Secret with a live GET: the operator needs only
// `get` on Secrets, never a cluster-wide watch of them.
func readSecretKey(ctx context.Context, reader client.Reader, namespace string, ref *hooksv1alpha1.SecretKeyReference) (string, error) {
	if ref == nil {
		return "", nil
	}
	var s corev1.Secret
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, &s); err != nil {
		return "", fmt.Errorf("read secret %s/%s: %w", namespace, ref.Name, err)
	}
	key := ref.Key
	if key == "" {
		key = "token"
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("secret %s/%s has no key %q", namespace, ref.Name, key)
	}
	return strings.TrimSpace(string(v)), nil
}
