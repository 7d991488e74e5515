package archivewatermark_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/archive/pgtest"
	"github.com/settlement-operator/settlement-operator/internal/archivewatermark"
	"github.com/settlement-operator/settlement-operator/test/testenv"
)

func settlement(name string) *hooksv1alpha1.BillingSettlement {
	return &hooksv1alpha1.BillingSettlement{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: name, UID: types.UID("uid-" + name)},
		Spec: hooksv1alpha1.BillingSettlementSpec{BillingProviderRef: "billing", SettlementKey: `["k","` + name + `"]`,
			IdempotencyKey: "stl_" + name, Customer: "cus_1"},
		Status: hooksv1alpha1.BillingSettlementStatus{State: hooksv1alpha1.SettlementSettled, Exposure: hooksv1alpha1.ExposureConfirmed},
	}
}

// A real API server for the ConfigMap and a real PostgreSQL restored from a copy of its
// data directory: the watermark covers each archived row, a new leader's Cover after
// the restore finds the archive behind instead of moving the watermark onto rows that
// reuse the lost numbers, the state lasts until the watermark is removed, and then the
// watermark starts again.
func TestCoverNeverHidesARestore(t *testing.T) {
	ctx := context.Background()
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	cl, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "operator"}}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "operator", Name: "archive"}, Data: map[string]string{"archiveID": "x"}}
	for _, o := range []client.Object{ns, cm} {
		if err := cl.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	watermark := func() archive.Mark {
		t.Helper()
		var got corev1.ConfigMap
		if err := cl.Get(ctx, client.ObjectKeyFromObject(cm), &got); err != nil {
			t.Fatal(err)
		}
		var m archive.Mark
		if v := got.Data[archivewatermark.Key]; v != "" {
			if err := json.Unmarshal([]byte(v), &m); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}

	pg, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if err := pg.CreateDatabase("archive"); err != nil {
		t.Fatal(err)
	}
	open := func() (*archive.Store, *archivewatermark.Keeper) {
		t.Helper()
		s, err := archive.Open(archive.Config{URL: pg.URL("archive")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		k := &archivewatermark.Keeper{Client: cl, Archive: s, Namespace: "operator", ConfigMap: "archive"}
		if err := k.Check(ctx); err != nil {
			t.Fatal(err)
		}
		return s, k
	}
	archived := func(s *archive.Store, k *archivewatermark.Keeper, name string) {
		t.Helper()
		if err := s.ArchiveSettlement(ctx, settlement(name)); err != nil {
			t.Fatal(err)
		}
		if err := k.Cover(ctx); err != nil {
			t.Fatal(err)
		}
	}

	s1, k1 := open()
	archived(s1, k1, "stl-a")
	if m := watermark(); m.Name != "stl-a" || m.Seq == 0 {
		t.Fatalf("watermark after stl-a = %+v", m)
	}
	s1.Close()
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	backup, err := pg.CopyData()
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.StartAgain(); err != nil {
		t.Fatal(err)
	}
	s2, k2 := open()
	archived(s2, k2, "stl-b")
	lost := watermark()
	if lost.Name != "stl-b" {
		t.Fatalf("watermark after stl-b = %+v", lost)
	}
	s2.Close()

	// The restore, then a new leader: its first archivals reuse the lost numbers and
	// overtake the watermark's seq before it has compared anything.
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := pg.RestoreData(backup); err != nil {
		t.Fatal(err)
	}
	if err := pg.StartAgain(); err != nil {
		t.Fatal(err)
	}
	s3, err := archive.Open(archive.Config{URL: pg.URL("archive")})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if err := s3.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k3 := &archivewatermark.Keeper{Client: cl, Archive: s3, Namespace: "operator", ConfigMap: "archive"}
	for _, n := range []string{"stl-c", "stl-d", "stl-e"} {
		if err := s3.ArchiveSettlement(ctx, settlement(n)); err != nil {
			t.Fatal(err)
		}
	}
	if s3.LastReadBack().Seq <= lost.Seq {
		t.Fatalf("the new rows did not overtake the lost seq: %+v vs %+v", s3.LastReadBack(), lost)
	}
	if err := k3.Cover(ctx); !errors.Is(err, archivewatermark.ErrBehind) {
		t.Fatalf("Cover let a record leave the cluster for an archive behind it: %v", err)
	}
	if s3.Behind() == "" {
		t.Fatal("Cover moved past a restore without finding the archive behind")
	}
	if m := watermark(); m != lost {
		t.Fatalf("the watermark moved while the archive is behind: %+v, want %+v", m, lost)
	}
	if err := s3.ArchiveSettlement(ctx, settlement("stl-f")); err != nil {
		t.Fatal(err)
	}
	if err := k3.Cover(ctx); !errors.Is(err, archivewatermark.ErrBehind) {
		t.Fatalf("while behind, records stay in the cluster: Cover answered %v", err)
	}
	if err := k3.Check(ctx); err != nil || s3.Behind() == "" || watermark() != lost {
		t.Fatalf("the state must last until a person confirms: %v, %q, %+v", err, s3.Behind(), watermark())
	}
	// A second replica, on its own connection, finds it behind too.
	s4, err := archive.Open(archive.Config{URL: pg.URL("archive")})
	if err != nil {
		t.Fatal(err)
	}
	defer s4.Close()
	if err := s4.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	k4 := &archivewatermark.Keeper{Client: cl, Archive: s4, Namespace: "operator", ConfigMap: "archive"}
	if err := k4.Check(ctx); err != nil || s4.Behind() == "" {
		t.Fatalf("a second replica did not find the archive behind: %v, %q", err, s4.Behind())
	}

	// A person confirms: the watermark is removed, the state clears, and it starts again
	// from the next row archived (not from a row read back before).
	var got corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKeyFromObject(cm), &got); err != nil {
		t.Fatal(err)
	}
	delete(got.Data, archivewatermark.Key)
	if err := cl.Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if err := k3.Check(ctx); err != nil || s3.Behind() != "" {
		t.Fatalf("after confirmation: %v, %q", err, s3.Behind())
	}
	archived(s3, k3, "stl-g")
	if m := watermark(); m.Name != "stl-g" {
		t.Fatalf("watermark after confirmation = %+v", m)
	}
	if err := k3.Check(ctx); err != nil || s3.Behind() != "" {
		t.Fatalf("a current archive after confirmation: %v, %q", err, s3.Behind())
	}
	// The second replica checked only after the first had written a new watermark: it
	// never read the confirmation (no watermark), yet the archive holds the current one.
	if err := k4.Check(ctx); err != nil || s4.Behind() != "" {
		t.Fatalf("a replica that missed the confirmation stays behind: %v, %q", err, s4.Behind())
	}
}
