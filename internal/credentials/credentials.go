package credentials

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
)

// Credentials leave the operator only where their Secret says they may go
// (decisions.md "Credentials"). Anyone who may create a BillingProvider or
// a WebhookProvider route chooses an endpoint and names a Secret of the namespace; the
// operator reads every Secret (`get`), so without this check such a user could have
// it send a Secret they cannot read (a database password, say) as a bearer token to a
// server of their choosing. A Secret is sent only if it opts in to the use
// (LabelCredentialFor) and lists the destination (AnnotationCredentialDestinations):
// both need `patch` on the Secret, which only someone who may read it holds in
// practice. Signing Secrets are read by the receiver and never sent, so they need no
// opt-in.

// RefusedError says that a Secret may not be sent for a use to a
// destination, and what to add to the Secret if it is meant for it. It never holds the
// Secret's value, nor the destinations the Secret lists.
type RefusedError struct {
	// Namespace and Secret name the refused Secret.
	Namespace, Secret string
	// Use is the use asked for (hooksv1alpha1.CredentialForBilling or CredentialForJobSink).
	Use string
	// Destination is where it would have been sent.
	Destination string
	// Reason says which opt-in is missing.
	Reason string
}

// Error tells a human exactly which label and annotation to add.
func (e *RefusedError) Error() string {
	return fmt.Sprintf("Secret %q is not sent to %s: %s. The operator sends a Secret only if it carries label %s=%s "+
		"and lists the destination in annotation %s (comma-separated URL prefixes); if this Secret is meant for it, "+
		"whoever may edit it runs: kubectl label secret %s -n %s %s=%s; kubectl annotate secret %s -n %s %s=%s "+
		"(keep any destinations already listed). Nothing is sent until then",
		e.Secret, e.Destination, e.Reason, hooksv1alpha1.LabelCredentialFor, e.Use,
		hooksv1alpha1.AnnotationCredentialDestinations,
		e.Secret, e.Namespace, hooksv1alpha1.LabelCredentialFor, e.Use,
		e.Secret, e.Namespace, hooksv1alpha1.AnnotationCredentialDestinations, e.Destination)
}

// ErrKeyMissing: the Secret opts in but lacks the referenced key.
var ErrKeyMissing = errors.New("the key is missing or empty")

// IsRefused reports whether err is (or wraps) a CredentialRefusedError.
func IsRefused(err error) bool {
	var refused *RefusedError
	return errors.As(err, &refused)
}

// Read reads one key of a Secret with a live GET (the operator needs only
// `get` on Secrets, never a watch of them, and a change to the Secret's opt-in applies
// on its next use) and returns it only if the Secret opts in to use at destination.
// A refusal is a *CredentialRefusedError; the key is looked at only after the opt-in,
// so a refused Secret discloses nothing about its content.
func Read(ctx context.Context, reader client.Reader, namespace string, ref *hooksv1alpha1.SecretKeyReference,
	use, destination string) (string, error) {
	if ref == nil {
		return "", nil
	}
	var s corev1.Secret
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, &s); err != nil {
		return "", fmt.Errorf("read secret %s/%s: %w", namespace, ref.Name, err)
	}
	if why := Refusal(s.Labels, s.Annotations, use, destination); why != "" {
		return "", &RefusedError{Namespace: namespace, Secret: ref.Name, Use: use, Destination: destination, Reason: why}
	}
	key := ref.Key
	if key == "" {
		key = "token"
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("secret %s/%s has no key %q: %w", namespace, ref.Name, key, ErrKeyMissing)
	}
	return strings.TrimSpace(string(v)), nil
}

// Refusal says why a Secret with these labels and annotations may not be
// sent for use to destination, or "" if it may. Pure, so the rules are table-tested.
func Refusal(labels, annotations map[string]string, use, destination string) string {
	got, ok := labels[hooksv1alpha1.LabelCredentialFor]
	switch {
	case !ok:
		return "it has no label " + hooksv1alpha1.LabelCredentialFor
	case got != use:
		return fmt.Sprintf("its label %s is %q, not %q", hooksv1alpha1.LabelCredentialFor, got, use)
	}
	listed, ok := annotations[hooksv1alpha1.AnnotationCredentialDestinations]
	if !ok || strings.TrimSpace(listed) == "" {
		return "it has no annotation " + hooksv1alpha1.AnnotationCredentialDestinations
	}
	target, ok := parseDestination(destination)
	if !ok {
		return "the destination is not an absolute http(s) URL with a plain path (no user info, query, fragment, " +
			`"..", ";", "\" or encoded "/", "\" or ".")`
	}
	for _, raw := range strings.FieldsFunc(listed, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		if prefix, ok := parseDestination(raw); ok && destinationWithin(target, prefix) {
			return ""
		}
	}
	return "its annotation " + hooksv1alpha1.AnnotationCredentialDestinations + " does not list this destination"
}

// destination is a URL reduced to what decides where a request goes.
type destination struct {
	scheme, host, port, path string
}

// parseDestination parses an absolute http(s) URL. User info, a query or a fragment
// make it unusable as a destination or a prefix: they only obscure where a request goes.
func parseDestination(raw string) (destination, bool) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" || u.Hostname() == "" {
		return destination{}, false
	}
	d := destination{scheme: strings.ToLower(u.Scheme), host: strings.ToLower(u.Hostname()), port: u.Port()}
	switch d.scheme {
	case "https":
		if d.port == "" {
			d.port = "443"
		}
	case "http":
		if d.port == "" {
			d.port = "80"
		}
	default:
		return destination{}, false
	}
	// A path that servers may read differently than we do is refused, not interpreted:
	// "..", "." and "//" segments, ";" (path parameters: Tomcat and Spring drop
	// "/..;/"), a backslash (IIS reads it as "/") and an encoded "/", backslash or ".". What is left
	// compares the same way everywhere.
	escaped := strings.ToLower(u.EscapedPath())
	if strings.ContainsAny(u.Path, ";\\") || strings.Contains(escaped, "%2f") || strings.Contains(escaped, "%5c") ||
		strings.Contains(escaped, "%2e") {
		return destination{}, false
	}
	d.path = strings.TrimRight(path.Clean("/"+u.Path), "/")
	if written := strings.TrimRight("/"+strings.TrimPrefix(u.Path, "/"), "/"); written != d.path {
		return destination{}, false
	}
	return d, true
}

// destinationWithin: same scheme, host and port, and the path equal to the prefix's or
// below it at a segment boundary ("/v1" covers "/v1" and "/v1/x", not "/v10").
func destinationWithin(target, prefix destination) bool {
	if target.scheme != prefix.scheme || target.host != prefix.host || target.port != prefix.port {
		return false
	}
	return prefix.path == "" || target.path == prefix.path || strings.HasPrefix(target.path, prefix.path+"/")
}
