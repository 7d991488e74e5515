package providerclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/billing"
	"github.com/settlement-operator/settlement-operator/internal/billing/adapters"
	"github.com/settlement-operator/settlement-operator/internal/credentials"
	"github.com/settlement-operator/settlement-operator/internal/settlement"
)

// Clients caches one billing client per BillingProvider, keyed by its UID,
// generation and a fingerprint of its token, so connections are pooled and a spec
// change or a token rotation takes effect on the next reconcile.
type Clients struct {
	mu      sync.Mutex
	clients map[string]billing.Client
	// secrets keeps the credentials' Secrets for CredentialTTL (one GET per Secret
	// and TTL, not one per settlement).
	secrets credentials.SecretReader
}

func (pc *Clients) Get(ctx context.Context, reader client.Reader,
	newClient func(adapters.Settings) (billing.Client, error), bp *hooksv1alpha1.BillingProvider,
	health *Health) (billing.Client, error) {
	pc.mu.Lock()
	if pc.secrets.Reader == nil {
		pc.secrets.Reader, pc.secrets.TTL = reader, credentials.SecretTTL
	}
	pc.mu.Unlock()
	// The opt-in is checked on every use (against a copy at most CredentialTTL old),
	// so a Secret that stops opting in is no longer sent.
	secretKey := types.NamespacedName{Namespace: bp.Namespace, Name: bp.Spec.CredentialsSecretRef.Name}
	token, err := credentials.Read(ctx, &pc.secrets, bp.Namespace, &bp.Spec.CredentialsSecretRef,
		hooksv1alpha1.CredentialForBilling, bp.Spec.Endpoint)
	if err != nil {
		return nil, err
	}
	key := fmt.Sprintf("%s/%d/%s", bp.UID, bp.Generation, tokenFingerprint(token))
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if c, ok := pc.clients[key]; ok {
		return c, nil
	}
	if newClient == nil {
		newClient = adapters.New // the adapter of bp.Spec.Type
	}
	c, err := newClient(adapters.Settings{Provider: bp.DeepCopy(), Token: token,
		Timeout: settlement.RequestTimeoutOf(bp)})
	if err != nil {
		return nil, fmt.Errorf("billing provider %s: %w", bp.Name, err)
	}
	if pc.clients == nil {
		pc.clients = map[string]billing.Client{}
	}
	for k := range pc.clients {
		if strings.HasPrefix(k, string(bp.UID)+"/") {
			delete(pc.clients, k)
		}
	}
	c = observedClient{Client: c, bp: bp.DeepCopy(), health: health,
		rejected: func() { pc.secrets.Forget(secretKey) }}
	pc.clients[key] = c
	return c, nil
}

// tokenFingerprint identifies a token in a cache key without keeping it readable.
func tokenFingerprint(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}
