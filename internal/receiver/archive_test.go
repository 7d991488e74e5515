package receiver

import (
	"context"
	"errors"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/settlement-operator/settlement-operator/internal/archive"
)

// archiveStub stands in for the archive's receipt lookup (a PostgreSQL answer is
// covered by the operations suite); it is not Kubernetes, which stays real here.
type archiveStub struct {
	answer func(ctx context.Context) (*archive.EventReceipt, error)
}

func (a archiveStub) Event(ctx context.Context, _, _, _ string) (*archive.EventReceipt, error) {
	return a.answer(ctx)
}

var _ = Describe("the receiver with an archive (docs/design.md §12)", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		install(inferenceProvider(ns), map[string]string{"current": swhSecret})
		DeferCleanup(func() { recv.opts.Archive = nil })
	})

	It("stores and acknowledges a delivery when the archive hangs, within its short timeout", func() {
		recv.opts.Archive = archiveStub{answer: func(ctx context.Context) (*archive.EventReceipt, error) {
			<-ctx.Done() // never answers
			return nil, ctx.Err()
		}}
		start := time.Now()
		r := send(ns, "inference", "msg_archive_hangs", completedV2)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(decode(r.Body)["status"]).To(Equal("accepted"))
		Expect(time.Since(start)).To(BeNumerically("<", 5*time.Second), "bounded by the archive timeout, not the sender's")
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("stores and acknowledges a delivery when the archive fails", func() {
		recv.opts.Archive = archiveStub{answer: func(context.Context) (*archive.EventReceipt, error) {
			return nil, errors.New("connection refused")
		}}
		r := send(ns, "inference", "msg_archive_down", completedV2)
		Expect(r.Status).To(Equal(http.StatusOK), r.Body)
		Expect(listEvents(ns)).To(HaveLen(1))
	})

	It("answers from an archived receipt without a write: the same payload duplicate, another 409 with a quarantine record", func() {
		first := send(ns, "inference", "msg_archived", completedV2)
		Expect(first.Status).To(Equal(http.StatusOK))
		stored := listEvents(ns)
		Expect(stored).To(HaveLen(1))
		// As if the event had been archived and removed from the cluster.
		Expect(k8s.Delete(ctx, &stored[0])).To(Succeed())
		Eventually(func() error { return mgrCache.Get(ctx, keyOf(&stored[0]), &stored[0]) }).ShouldNot(Succeed())
		recv.opts.Archive = archiveStub{answer: func(context.Context) (*archive.EventReceipt, error) {
			return &archive.EventReceipt{Namespace: ns, Name: stored[0].Name, PayloadHash: stored[0].Spec.PayloadHash}, nil
		}}
		before := creates.Load()
		r := send(ns, "inference", "msg_archived", completedV2)
		Expect(r.Status).To(Equal(http.StatusOK))
		Expect(decode(r.Body)["status"]).To(Equal("duplicate"))
		Expect(creates.Load()).To(Equal(before), "a duplicate of an archived event costs no write")

		r = send(ns, "inference", "msg_archived", completedV2[:len(completedV2)-2]+`,"x":1}}`)
		Expect(r.Status).To(Equal(http.StatusConflict), r.Body)
		q := listEvents(ns)
		Expect(q).To(HaveLen(1))
		Expect(q[0].Spec.Quarantine).NotTo(BeNil())
		Expect(q[0].Spec.Quarantine.OriginalEvent).To(Equal(stored[0].Name))
	})
})

func keyOf(obj client.Object) client.ObjectKey { return client.ObjectKeyFromObject(obj) }
