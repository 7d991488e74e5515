package archiver

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// Migrator applies the archive's schema migrations at start, on every replica
// (each replica's receiver reads the archive), and keeps trying while the archive is
// down: the manager starts and receives webhooks regardless; archival and the archive
// lookups wait until the schema is there.
type Migrator struct {
	Archive *archive.Store
	// Retry is the wait between attempts (5s).
	Retry time.Duration
	// Client reads and creates the identity ConfigMap (a direct client: this runs
	// before the caches start, on every replica).
	Client client.Client
	// Namespace and ConfigMap name where the cluster remembers which archive it
	// archives to. Without a namespace the check is skipped (and said so).
	Namespace, ConfigMap string
	// Watermark, when set, is compared with the archive once it is ready and then
	// every CheckEvery (30s): an archive behind the cluster is a state of its own
	// (internal/archivewatermark). Every new connection is checked as well (the store
	// does it before the connection is used).
	Watermark  *archivewatermark.Keeper
	CheckEvery time.Duration
}

// ArchiveIdentityKey is the ConfigMap key holding the archive's ID.
const ArchiveIdentityKey = "archiveID"

var errIdentityUnchecked = errors.New("the archive's identity is not checked yet")

// checkIdentity compares the archive's ID with the one the cluster recorded, recording
// it the first time. An archive that is not the one this cluster archived to is held
// unavailable: taking an empty or other database for "nothing archived" would let
// archived events and keys be dispatched and charged again.
func (m *Migrator) checkIdentity(ctx context.Context) error {
	id, err := m.Archive.Identity(ctx)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.ConfigMap}
	var cm corev1.ConfigMap
	err = m.Client.Get(ctx, key, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: m.ConfigMap,
			Annotations: map[string]string{"hooks.settlement.dev/description": "The archive this cluster's finished records are in " +
				"(docs/archive-operations.md). Delete it only to point the operator at another archive on purpose."}},
			Data: map[string]string{ArchiveIdentityKey: id}}
		if err = m.Client.Create(ctx, &cm); apierrors.IsAlreadyExists(err) {
			err = m.Client.Get(ctx, key, &cm)
		}
	}
	if err != nil {
		return fmt.Errorf("read the archive identity ConfigMap %s: %w", key, err)
	}
	if got := cm.Data[ArchiveIdentityKey]; got != id {
		return fmt.Errorf("%w: the database has archive ID %q, but this cluster archived to %q (ConfigMap %s); "+
			"point --archive-database-url at that archive, or delete the ConfigMap to start a new one on purpose", errWrongArchive, id, got, key)
	}
	return nil
}

var errWrongArchive = errors.New("not the archive this cluster archived to")

// NeedLeaderElection: every replica migrates (under the archive's advisory lock).
func (m *Migrator) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (m *Migrator) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("archive")
	wait := m.Retry
	if wait <= 0 {
		wait = 5 * time.Second
	}
	if m.Namespace != "" {
		m.Archive.Hold(errIdentityUnchecked)
	} else {
		logger.Info("the archive's identity is not checked: the operator's namespace is unknown (set POD_NAMESPACE)")
	}
	for {
		err := m.Archive.Migrate(ctx)
		if err == nil && m.Namespace != "" {
			if err = m.checkIdentity(ctx); err == nil {
				// The watermark too before anything reads the archive: a restored
				// archive is behind from its first read, not from the next check.
				if err = m.Watermark.Check(ctx); err == nil {
					m.Archive.Hold(nil)
				}
			} else if errors.Is(err, errWrongArchive) {
				m.Archive.Hold(err)
			}
		}
		metrics.NoteArchive("schema", err)
		if err == nil {
			v, _ := m.Archive.SchemaVersion(ctx)
			logger.Info("archive ready", "schemaVersion", v)
			break
		}
		logger.Error(err, "archive not ready; webhooks are still received, archival waits", "retryIn", wait.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	every := m.CheckEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	reported := ""
	for {
		if err := m.Watermark.Check(ctx); err != nil {
			logger.Info("the archive could not be compared with the cluster's watermark; trying again", "error", err.Error(), "retryIn", every.String())
		}
		if why := m.Archive.Behind(); why != reported {
			reported = why
			if why != "" {
				logger.Error(errors.New(why), "archive behind the cluster: settlements not yet sent are looked up by key first until a person confirms (docs/runbook.md, SettlementArchiveBehind)")
			} else {
				logger.Info("archive no longer behind: confirmed by removing the watermark")
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}
