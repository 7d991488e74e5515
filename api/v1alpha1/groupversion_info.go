// Package v1alpha1 contains the API types of the hooks.settlement.dev group: the
// configuration of webhook senders and billing backends, the durable receipt of each
// delivered event, and the per-operation records (job completions, billing settlements)
// that turn at-least-once deliveries into exactly-once business effects.
//
// +kubebuilder:object:generate=true
// +groupName=hooks.settlement.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "hooks.settlement.dev", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &schemeBuilder{}

	// AddToScheme adds this package's kinds to a scheme; managers and tests call it once.
	AddToScheme = SchemeBuilder.AddToScheme
)

// schemeBuilder collects this package's kinds for AddToScheme. It does what
// controller-runtime's scheme.Builder does with apimachinery alone, so that the API
// package (and the pure packages that read its types, such as internal/settlement)
// depend on nothing but apimachinery.
type schemeBuilder struct{ runtime.SchemeBuilder }

// Register adds kinds of this group and version to the builder.
func (b *schemeBuilder) Register(objects ...runtime.Object) *schemeBuilder {
	b.SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, objects...)
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	return b
}

// AddToScheme adds every kind registered so far to s.
func (b *schemeBuilder) AddToScheme(s *runtime.Scheme) error { return b.SchemeBuilder.AddToScheme(s) }
