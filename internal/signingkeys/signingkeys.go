// Package signingkeys chooses the keys of a WebhookProvider's signing Secret that sign
// its deliveries (docs/design.md §15). It is the one place that decides: the
// webhookprovider controller writes Ready from Select's answer and the receiver
// verifies with Select's keys, so a provider the controller reports unusable never
// accepts a delivery, and a key it does not count never verifies one.
//
// Only named keys sign (spec.signature.secretRef.keys). A Secret is a bag of values:
// a certificate kept beside the HMAC secret is public, and a signature made with it
// would prove nothing. So a TLS Secret, a key named like a certificate or a private
// key, and a value that is PEM are refused. A provider that names no key (created
// before the field existed) signs with its Secret's only key; with several it must
// name them.
//
// Select only picks values; how a value is decoded stays with the signature scheme
// (internal/signature), which Select asks whether each value is usable.
package signingkeys

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/signature"
)

// Keys are the values that sign a provider's deliveries.
type Keys struct {
	// Names are the Secret's keys, in the order they are tried; the receiver's
	// key_index metric label is the position in this list.
	Names []string
	// Values are the keys' values, as stored (the scheme decodes them).
	Values [][]byte
	// Implicit is true when the provider names no key and the Secret's only key is
	// used: the Ready condition asks to name it.
	Implicit bool
}

// Refusal says why a provider's signing keys cannot be used: its Reason is the Ready
// condition's reason, its message names the Secret and the key (never a value) and
// says what to do.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// AsRefusal returns the Refusal err is or wraps, if any.
func AsRefusal(err error) (*Refusal, bool) {
	var r *Refusal
	ok := errors.As(err, &r)
	return r, ok
}

// until is how every refusal ends: what the sender sees meanwhile.
const until = "; deliveries are answered 503 (the sender retries, nothing is lost) until then"

// refusedTypes are the Secret types Kubernetes defines for other purposes: each holds
// a certificate, a private key, a token or a password with its own meaning, never a
// webhook signing secret. Opaque and custom types are accepted.
var refusedTypes = map[corev1.SecretType]string{
	corev1.SecretTypeTLS:                 "it holds a certificate and its private key, and a certificate is public",
	corev1.SecretTypeSSHAuth:             "it holds an SSH private key",
	corev1.SecretTypeServiceAccountToken: "it holds a service account's API token and the cluster's CA certificate",
	corev1.SecretTypeDockercfg:           "it holds registry credentials",
	corev1.SecretTypeDockerConfigJson:    "it holds registry credentials",
	corev1.SecretTypeBasicAuth:           "it holds a user name and password",
	corev1.SecretTypeBootstrapToken:      "it holds a bootstrap token",
}

// certificateSuffixes and certificateNames are key names that by convention hold
// certificates, private keys or keystores (compared in lower case).
var (
	certificateSuffixes = []string{".crt", ".cer", ".pem", ".der", ".key", ".csr", ".pub", ".p12", ".pfx", ".jks", ".p8"}
	certificateNames    = []string{"ssh-privatekey", "ssh-publickey", "id_rsa", "id_ecdsa", "id_ed25519", "id_dsa"}
)

// CertificateLike reports whether a Secret key's name is one that holds a certificate,
// a private key or a keystore by convention (tls.crt, tls.key, ca.crt, *.pem...).
func CertificateLike(name string) bool {
	n := strings.ToLower(name)
	for _, s := range certificateSuffixes {
		if strings.HasSuffix(n, s) {
			return true
		}
	}
	for _, c := range certificateNames {
		if n == c {
			return true
		}
	}
	return false
}

// pemMarker starts every PEM block (certificates, private keys, OpenSSH keys).
var pemMarker = []byte("-----BEGIN ")

// Select returns the keys of secret that sign deliveries for a provider whose
// signing Secret is ref and whose scheme is scheme, or a *Refusal saying why none may.
// It never returns a Refusal for one key and keys for the others: a provider's keys
// are usable together or not at all, so Ready=False always means nothing is accepted.
func Select(secret *corev1.Secret, ref hooksv1alpha1.SigningSecretReference, scheme string) (Keys, error) {
	if why, refused := refusedTypes[secret.Type]; refused {
		return Keys{}, &Refusal{Reason: hooksv1alpha1.ReasonSigningKeyRefused, Message: fmt.Sprintf(
			"Secret %q is of type %s: %s, so it cannot hold a webhook signing secret. Put the sender's signing secret in an "+
				"Opaque Secret (kubectl create secret generic), set spec.signature.secretRef.name to it and name its key in "+
				"spec.signature.secretRef.keys"+until,
			secret.Name, secret.Type, why)}
	}
	names, implicit := ref.Keys, false
	if len(names) == 0 {
		present := nonEmptyKeys(secret)
		switch len(present) {
		case 0:
			return Keys{}, &Refusal{Reason: hooksv1alpha1.ReasonSecretInvalid, Message: fmt.Sprintf(
				"Secret %q holds no non-empty key: put the sender's signing secret in it and name its key in "+
					"spec.signature.secretRef.keys"+until, secret.Name)}
		case 1:
			names, implicit = present, true
		default:
			return Keys{}, &Refusal{Reason: hooksv1alpha1.ReasonSigningKeysUnnamed, Message: fmt.Sprintf(
				"Secret %q holds %d keys (%s) and spec.signature.secretRef.keys names none, so none signs: name the key the "+
					"sender signs with (two only while rotating)"+until, secret.Name, len(present), quoted(present))}
		}
	}
	keys := Keys{Names: names, Values: make([][]byte, 0, len(names)), Implicit: implicit}
	for _, name := range names {
		value, err := check(secret, name, scheme)
		if err != nil {
			return Keys{}, err
		}
		keys.Values = append(keys.Values, value)
	}
	return keys, nil
}

// check returns the value of one key that would sign, or why it may not.
func check(secret *corev1.Secret, name, scheme string) ([]byte, error) {
	refused := func(what string) error {
		return &Refusal{Reason: hooksv1alpha1.ReasonSigningKeyRefused, Message: fmt.Sprintf(
			"key %q of Secret %q %s, not a webhook signing secret: such a value may be public, so a signature made with "+
				"it proves nothing. Put the sender's signing secret under another key (e.g. \"signing-secret\") and name "+
				"that key in spec.signature.secretRef.keys"+until, name, secret.Name, what)}
	}
	if CertificateLike(name) {
		return nil, refused("is named like a certificate or a private key")
	}
	value, ok := secret.Data[name]
	switch {
	case !ok:
		return nil, &Refusal{Reason: hooksv1alpha1.ReasonSecretInvalid, Message: fmt.Sprintf(
			"key %q named in spec.signature.secretRef.keys is not in Secret %q: add it to the Secret, or name the key "+
				"that holds the sender's signing secret"+until, name, secret.Name)}
	case len(bytes.TrimSpace(value)) == 0:
		return nil, &Refusal{Reason: hooksv1alpha1.ReasonSecretInvalid, Message: fmt.Sprintf(
			"key %q of Secret %q is empty: put the sender's signing secret in it"+until, name, secret.Name)}
	case bytes.Contains(value, pemMarker):
		return nil, refused("holds PEM (a certificate or a key)")
	}
	if err := signature.CheckSecret(scheme, value); err != nil {
		return nil, &Refusal{Reason: hooksv1alpha1.ReasonSecretInvalid, Message: fmt.Sprintf(
			"key %q of Secret %q is not a valid %s signing secret (%v): copy it again from the sender"+until,
			name, secret.Name, scheme, err)}
	}
	return value, nil
}

// nonEmptyKeys lists the Secret's keys with a value, sorted.
func nonEmptyKeys(secret *corev1.Secret) []string {
	names := make([]string, 0, len(secret.Data))
	for k, v := range secret.Data {
		if len(bytes.TrimSpace(v)) > 0 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names
}

// quoted lists names quoted, the first eight of them.
func quoted(names []string) string {
	const most = 8
	q := make([]string, 0, most+1)
	for i, n := range names {
		if i == most {
			q = append(q, fmt.Sprintf("and %d more", len(names)-most))
			break
		}
		q = append(q, strconv.Quote(n))
	}
	return strings.Join(q, ", ")
}
