package controllers

import (
	"context"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// ArchiveMigrator applies the archive's schema migrations at start, on every replica
// (each replica's receiver reads the archive), and keeps trying while the archive is
// down: the manager starts and receives webhooks regardless; archival and the archive
// lookups wait until the schema is there.
type ArchiveMigrator struct {
	Archive *archive.Store
	// Retry is the wait between attempts (5s).
	Retry time.Duration
}

// NeedLeaderElection: every replica migrates (under the archive's advisory lock).
func (m *ArchiveMigrator) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (m *ArchiveMigrator) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("archive")
	wait := m.Retry
	if wait <= 0 {
		wait = 5 * time.Second
	}
	for {
		err := m.Archive.Migrate(ctx)
		noteArchive("schema", err)
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
	<-ctx.Done()
	return nil
}

// WatchedNamespaces turns --watch-namespaces ("a,b") into the cache's namespaces: the
// receiver, the controllers and the archiver of this deployment then see only those,
// so several deployments can shard tenants and each one's memory follows its own.
// Empty: all namespaces (nil).
func WatchedNamespaces(list string) map[string]cache.Config {
	var out map[string]cache.Config
	for _, ns := range strings.Split(list, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			if out == nil {
				out = map[string]cache.Config{}
			}
			out[ns] = cache.Config{}
		}
	}
	return out
}
