// Package v1alpha1 contains the API types of the hooks.settlement.dev group: the
// configuration of webhook senders and billing backends, the durable receipt of each
// delivered event, and the per-operation records (job completions, billing settlements)
// that turn at-least-once deliveries into exactly-once business effects.
//
// +kubebuilder:object:generate=true
// +groupName=hooks.settlement.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "hooks.settlement.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's kinds to a scheme; managers and tests call it once.
	AddToScheme = SchemeBuilder.AddToScheme
)
