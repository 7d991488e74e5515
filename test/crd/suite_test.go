package crd_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/settlement-operator/settlement-operator/test/testenv"
)

// These specs prove the API's contract on a real kube-apiserver: the CRDs load, every
// sample is valid, every CEL rule refuses what it must with a readable message, and
// the printer columns and `kubectl explain` text work.

var (
	env     *envtest.Environment
	cfg     *rest.Config
	k8s     client.Client
	kubectl *envtest.AuthenticatedUser
	ctx     context.Context
	cancel  context.CancelFunc
)

func TestCRDs(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "CRD contract suite")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())
	var err error
	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	kubectl, err = env.AddUser(envtest.User{Name: "crd-tester", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	cancel()
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
