package archiver

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/metrics"
)

// The archiver's reconciles archive together (docs/design.md §12, "Batched
// archival"): each reconcile that finds its record ready hands the record to the
// batcher and waits; the batcher archives a batch with one insert and one read-back
// per table (archive.Store.ArchiveBatch), then moves the watermark once for the whole
// batch, and only then lets the reconciles go on, each to delete its own record with
// its preconditions (concurrently, one worker each).

const (
	// DefaultBatchSize is how many records a batch holds at most: it flushes as soon
	// as it is full. 100 rows of the widest table (34 columns) are 3,400 parameters,
	// far below PostgreSQL's 65,535; a batch's statements stay well under the
	// statement timeout.
	DefaultBatchSize = 100
	// DefaultBatchLinger is how long a batch waits for more records after its first
	// one: a record waits at most this long (plus the flush) beyond its archive-after,
	// which is an hour by default, and a lone record still goes promptly.
	DefaultBatchLinger = 100 * time.Millisecond
)

// moment names a point of an archival the tests interrupt there (Reconciler.at): a
// kill -9 of the archiving process, a concurrent write.
type moment string

const (
	// momentReadBack: every row of a batch is inserted and read back, the watermark not
	// yet moved.
	momentReadBack moment = "read back"
	// momentCovered: the watermark covers the batch, no record of it is deleted yet.
	momentCovered moment = "covered"
	// momentReleased: an archived settlement's protection finalizer is removed, its
	// DELETE not sent yet.
	momentReleased moment = "released"
)

// archived is what a reconcile learns of its record's archival: err is the archive's
// answer for this record (nil: inserted and read back; *archive.ConflictError: it
// stays), notCovered, when the record is archived, why the watermark could not cover
// it (it then stays too).
type archived struct {
	err, notCovered error
}

type pending struct {
	rec  archive.Record
	done chan archived
}

// batcher collects the records the reconciles found ready and archives them
// together. One runs per manager, on the leader (it is a manager Runnable, as the
// archiver's controllers are).
type batcher struct {
	store *archive.Store
	// cover moves the watermark past every row read back so far (Keeper.Cover).
	cover  func(context.Context) error
	size   int
	linger time.Duration
	in     chan pending
	// at, when set, is called at each moment (Reconciler.at); nil in production.
	at func(moment, client.Object)
}

func newBatcher(store *archive.Store, cover func(context.Context) error, size int, linger time.Duration) *batcher {
	if size <= 0 {
		size = DefaultBatchSize
	}
	if linger <= 0 {
		linger = DefaultBatchLinger
	}
	return &batcher{store: store, cover: cover, size: size, linger: linger, in: make(chan pending)}
}

// NeedLeaderElection: only the leader archives.
func (b *batcher) NeedLeaderElection() bool { return true }

// Start collects and flushes batches until ctx ends.
func (b *batcher) Start(ctx context.Context) error {
	for {
		var batch []pending
		select {
		case <-ctx.Done():
			return nil
		case p := <-b.in:
			batch = append(batch, p)
		}
		timer := time.NewTimer(b.linger)
	collect:
		for len(batch) < b.size {
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case p := <-b.in:
				batch = append(batch, p)
			case <-timer.C:
				break collect
			}
		}
		timer.Stop()
		b.flush(ctx, batch)
	}
}

// flush archives a batch: every record inserted and read back, then one watermark
// write for all of them, then each reconcile is told its record's outcome. A crash at
// any point leaves every record in the cluster (none is deleted before flush returns),
// and its row, if inserted, makes the next archival of the same content a no-op.
func (b *batcher) flush(ctx context.Context, batch []pending) {
	metrics.ArchiveBatchSize.Observe(float64(len(batch)))
	recs := make([]archive.Record, len(batch))
	for i, p := range batch {
		recs[i] = p.rec
	}
	errs := b.store.ArchiveBatch(ctx, recs)
	b.reach(momentReadBack)
	var notCovered error
	for _, err := range errs {
		if err == nil {
			// The watermark covers the rows before any of them leaves: an archive that
			// later lacks one is found behind, never taken for one that never had it.
			if cerr := b.cover(ctx); cerr != nil {
				notCovered = fmt.Errorf("move the archive watermark: %w", cerr)
			}
			break
		}
	}
	b.reach(momentCovered)
	for i, p := range batch {
		out := archived{err: errs[i]}
		if out.err == nil {
			out.notCovered = notCovered
		}
		p.done <- out // buffered: a reconcile that gave up waiting does not block the batch
	}
}

func (b *batcher) reach(m moment) {
	if b.at != nil {
		b.at(m, nil)
	}
}

// archive hands rec to the next batch and waits for its outcome. A context that ends
// first leaves the record's fate to the batch (archived or not, it stays in the
// cluster until a reconcile deletes it).
func (b *batcher) archive(ctx context.Context, rec archive.Record) archived {
	p := pending{rec: rec, done: make(chan archived, 1)}
	select {
	case b.in <- p:
	case <-ctx.Done():
		return archived{err: ctx.Err()}
	}
	select {
	case out := <-p.done:
		return out
	case <-ctx.Done():
		return archived{err: ctx.Err()}
	}
}
