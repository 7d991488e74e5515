// Package archivewatermark keeps the cluster's watermark of what it archived — the
// latest archived row it read back, by the archive's own insert sequence — in the
// archive's identity ConfigMap, beside the archive's ID, and compares the archive with
// it (docs/design.md §12, docs/archive.md "An archive behind the cluster").
//
// The watermark only moves forward, and only to a row that was committed and read
// back before the write: it never claims more than the archive durably held when it
// was written. Every record leaves the cluster only once the watermark covers it
// (Cover), so an archive that lacks the row the watermark names may lack records that
// are no longer in the cluster either: it is behind (archive.Store.Behind), a state
// that lasts until a person confirms it (removes the watermark from the ConfigMap).
package archivewatermark

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// Key is the ConfigMap key holding the watermark (JSON: seq, table, namespace, name).
const Key = "archiveWatermark"

// Keeper writes and checks the watermark. One per process; its methods are safe for
// concurrent use. A nil Keeper, or one without a namespace (outside a cluster, where
// the identity is not checked either), does nothing.
type Keeper struct {
	// Client reads and writes the ConfigMap (a direct client: no cache to lag).
	Client  client.Client
	Archive *archive.Store
	// Namespace and ConfigMap: the archive's identity ConfigMap.
	Namespace, ConfigMap string
	// Recorder records ArchiveBehind on the ConfigMap (optional).
	Recorder recorder.EventRecorder

	mu      sync.Mutex
	written archive.Mark // the watermark as last read or written
	// reported is the reason last recorded as an Event ("" when none is pending).
	reported string
	// lost is the watermark this replica read while it found the archive behind: the
	// state lasts while the ConfigMap holds it (zero when not behind).
	lost archive.Mark
}

func (k *Keeper) off() bool { return k == nil || k.Namespace == "" || k.Archive == nil }

func (k *Keeper) key() types.NamespacedName {
	return types.NamespacedName{Namespace: k.Namespace, Name: k.ConfigMap}
}

// read returns the ConfigMap and the watermark it holds (zero when it holds none).
func (k *Keeper) read(ctx context.Context) (*corev1.ConfigMap, archive.Mark, error) {
	var cm corev1.ConfigMap
	if err := k.Client.Get(ctx, k.key(), &cm); err != nil {
		return nil, archive.Mark{}, fmt.Errorf("read the archive identity ConfigMap %s: %w", k.key(), err)
	}
	var m archive.Mark
	if v := cm.Data[Key]; v != "" {
		if err := json.Unmarshal([]byte(v), &m); err != nil {
			return nil, archive.Mark{}, fmt.Errorf("the watermark in ConfigMap %s does not decode: %w", k.key(), err)
		}
	}
	return &cm, m, nil
}

// Check loads the watermark and compares the archive with it: an archive that lacks
// the row it names is behind (Warning Event ArchiveBehind on the ConfigMap,
// settlement_archive_behind 1). Behind stays until the watermark is removed from the
// ConfigMap by a person, which Check takes as the confirmation: the state clears and
// the watermark starts again from the next row read back. An error is an archive or
// API server that did not answer; the state is left as it was.
func (k *Keeper) Check(ctx context.Context) error {
	if k.off() {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	cm, m, err := k.read(ctx)
	if err != nil {
		return err
	}
	k.written = m
	k.Archive.SetWatermark(m)
	if m.IsZero() && k.Archive.Behind() != "" {
		// Confirmed by a person: what the archive lost is accounted for.
		k.clear(cm, "the watermark was removed: the archive is taken as it is now, and the watermark starts again")
		return nil
	}
	if k.Archive.Behind() != "" && !m.IsZero() {
		switch {
		case k.lost.IsZero():
			k.lost = m
		case m != k.lost:
			// A watermark other than the one this replica found lacking: written after
			// a person's confirmation, by a replica that checked it against the archive
			// first (none is written while a replica finds the archive behind). This
			// replica missed the moment the watermark was absent; an archive that holds
			// the new one is not behind it. (The lacking watermark itself never clears
			// the state by being found again: a restored archive reuses sequence numbers,
			// and a lost row's name can come back at its number by chance.)
			held, _, err := k.Archive.CheckMark(ctx, m)
			if err != nil {
				return err
			}
			if held {
				k.clear(cm, "the watermark was confirmed and written again by another replica, and the archive holds it")
				return nil
			}
		}
	}
	if k.Archive.Behind() == "" {
		held, why, err := k.Archive.CheckMark(ctx, m)
		if err != nil {
			return err
		}
		if !held {
			k.Archive.SetBehind(why)
			k.lost = m
		}
	}
	k.report(cm)
	return nil
}

// ErrBehind holds records in the cluster while the archive is behind: what is
// archived into a database that lost rows could be lost again with it (a standby
// pointed back at the newer primary, a person confirming), and the watermark cannot
// cover it.
var ErrBehind = errors.New("the archive is behind the cluster: records stay in the cluster until it holds the watermark again or a person confirms (docs/runbook.md, SettlementArchiveBehind)")

// clear ends the behind state after a confirmation (why says which), and the
// watermark starts again from the next row read back.
func (k *Keeper) clear(cm *corev1.ConfigMap, why string) {
	k.Archive.SetBehind("")
	k.Archive.ResetReadBack()
	k.reported, k.lost = "", archive.Mark{}
	metrics.SetArchiveBehind(false)
	k.event(cm, corev1.EventTypeNormal, hooksv1alpha1.ReasonArchiveBehindConfirmed, why)
}

// report makes the state visible once it is known (the first new connection may have
// found it before Check ran).
func (k *Keeper) report(cm *corev1.ConfigMap) {
	why := k.Archive.Behind()
	metrics.SetArchiveBehind(why != "")
	if why == "" || why == k.reported {
		return
	}
	k.reported = why
	k.event(cm, corev1.EventTypeWarning, hooksv1alpha1.ReasonArchiveBehind,
		why+"; settlements not yet sent are looked up by key before their first submission until a person confirms "+
			"(docs/runbook.md, SettlementArchiveBehind)")
}

func (k *Keeper) event(cm *corev1.ConfigMap, typ, reason, msg string) {
	if k.Recorder != nil && cm != nil {
		k.Recorder.Eventf(cm, nil, typ, reason, "CheckArchive", "%s", msg)
	}
}

// Cover makes the watermark cover every row this process has read back so far: call
// it after a record's insert was read back and before the record leaves the cluster.
// The write names the latest row read back (so every row read back before it), never
// one not yet committed; concurrent callers share one write. The watermark is not
// moved while the archive is behind, nor past a row the archive no longer holds (the
// current watermark is checked first): a restored archive must not pass for current
// once its reused sequence numbers overtake the lost ones. An error leaves the record
// in the cluster.
func (k *Keeper) Cover(ctx context.Context) error {
	if k.off() {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.Archive.Behind() != "" {
		return ErrBehind
	}
	m := k.Archive.LastReadBack()
	if m.Seq <= k.written.Seq {
		return nil
	}
	for attempt := 0; ; attempt++ {
		cm, cur, err := k.read(ctx)
		if err != nil {
			return err
		}
		k.written = cur
		k.Archive.SetWatermark(cur)
		if cur.Seq >= m.Seq {
			return nil // another process's write covers it
		}
		held, why, err := k.Archive.CheckMark(ctx, cur)
		if err != nil {
			return err
		}
		if !held {
			k.Archive.SetBehind(why)
			k.lost = cur
			metrics.SetArchiveBehind(true)
			return ErrBehind
		}
		b, _ := json.Marshal(m)
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[Key] = string(b)
		err = k.Client.Update(ctx, cm)
		if err == nil {
			k.written = m
			k.Archive.SetWatermark(m)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			return fmt.Errorf("write the archive watermark to ConfigMap %s: %w", k.key(), err)
		}
	}
}
