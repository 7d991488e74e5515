package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// clusterFlags are the flags of the commands that read (or, for replay, annotate) the
// cluster: keys, trace and replay. They fill a cmdline.Flags so that the namespace and
// the kubeconfig are found exactly as the archive commands find them.
type clusterFlags struct {
	common   cmdline.Flags
	provider string
}

const clusterHelp = `
Cluster:
  -n, --namespace NS        the namespace (default: the kubeconfig context's namespace,
                            or "default")
  --provider NAME           the WebhookProvider whose names are derived (default: every
                            WebhookProvider in the namespace)
  --kubeconfig FILE         default: $KUBECONFIG, then ~/.kube/config
  --context NAME            a kubeconfig context other than the current one
  --timeout DURATION        bound on each request (default 30s)
`

// register adds the cluster flags; withArchive adds the archive's flags too (trace).
func (c *clusterFlags) register(fs *flag.FlagSet, withArchive bool) {
	fs.StringVar(&c.common.Namespace, "n", "", "")
	fs.StringVar(&c.common.Namespace, "namespace", "", "")
	fs.StringVar(&c.common.Kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&c.common.KubeContext, "context", "", "")
	fs.DurationVar(&c.common.Timeout, "timeout", 30*time.Second, "")
	fs.StringVar(&c.provider, "provider", "", "")
	if withArchive {
		fs.StringVar(&c.common.DatabaseURL, "database-url", "", "")
		fs.StringVar(&c.common.FromSecret, "from-secret", "", "")
	}
}

func (c *clusterFlags) validate(cmd string, set map[string]bool) error {
	if err := c.common.Validate(cmd, set); err != nil {
		return err
	}
	if set["provider"] && c.provider == "" {
		return cmdline.Usagef(cmd, "--provider needs a WebhookProvider name")
	}
	return nil
}

// archiveConfigured reports whether trace should read the archive too: a flag, or the
// environment variable, names one.
func (c *clusterFlags) archiveConfigured(env func(string) string) bool {
	return c.common.DatabaseURL != "" || c.common.FromSecret != "" || env(EnvArchiveURL) != ""
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(hooksv1alpha1.AddToScheme(s))
	return s
}()

// kubeClient is a client of the cluster the kubeconfig names. It reads the API server
// directly (no cache): every answer is the current state.
func kubeClient(c *cmdline.Flags, env func(string) string) (client.Client, error) {
	cfg, err := kubeConfig(c, env).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("read the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-settlement"
	cfg.Timeout = c.Timeout
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connect to the cluster: %w", err)
	}
	return cl, nil
}

// getIfExists reads one object; false when it does not exist. Any other error (no
// permission, no connection) is returned, with what was being read.
func getIfExists(ctx context.Context, cl client.Client, ns, name string, obj client.Object) (bool, error) {
	// A reference that cannot be a name (a settlement key with "/", an event ID with
	// capitals) names no object: asking would only get a validation error back.
	if name == "" || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return false, nil
	}
	err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsForbidden(err):
		return false, fmt.Errorf("not allowed to read %s %s/%s: %w", kindOf(obj), ns, name, err)
	}
	return false, fmt.Errorf("read %s %s/%s: %w", kindOf(obj), ns, name, err)
}

func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *hooksv1alpha1.WebhookEvent:
		return "WebhookEvent"
	case *hooksv1alpha1.JobCompletion:
		return "JobCompletion"
	case *hooksv1alpha1.BillingSettlement:
		return "BillingSettlement"
	case *hooksv1alpha1.WebhookProvider:
		return "WebhookProvider"
	}
	return fmt.Sprintf("%T", obj)
}

// webhookProviders are the providers whose names are derived: --provider, else every
// WebhookProvider of the namespace.
func webhookProviders(ctx context.Context, cl client.Client, ns, provider string) ([]string, error) {
	if provider != "" {
		return []string{provider}, nil
	}
	var list hooksv1alpha1.WebhookProviderList
	if err := cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, errors.New("not allowed to list the WebhookProviders of namespace " + ns + ": give --provider")
		}
		return nil, fmt.Errorf("list the WebhookProviders of namespace %s (or give --provider): %w", ns, err)
	}
	out := make([]string, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, p.Name)
	}
	return out, nil
}

// findSettlements lists the namespace's settlements, a page at a time, and keeps those
// match accepts. It is the only way from an idempotency key (a hash) or a hand-written
// settlement key to its settlement.
func findSettlements(ctx context.Context, cl client.Client, ns string, match func(*hooksv1alpha1.BillingSettlement) bool) ([]hooksv1alpha1.BillingSettlement, error) {
	var out []hooksv1alpha1.BillingSettlement
	cont := ""
	for {
		var list hooksv1alpha1.BillingSettlementList
		if err := cl.List(ctx, &list, client.InNamespace(ns), client.Limit(500), client.Continue(cont)); err != nil {
			return nil, fmt.Errorf("list the BillingSettlements of namespace %s: %w", ns, err)
		}
		for i := range list.Items {
			if match(&list.Items[i]) {
				out = append(out, list.Items[i])
			}
		}
		if cont = list.Continue; cont == "" {
			return out, nil
		}
	}
}

// clusterCommand is how trace and replay start: their flags parsed and checked, the
// one reference they take (described by what, for the error when it is missing), the
// namespace and a client.
func (c *command) clusterCommand(cmd string, args []string, withArchive bool, help, what string, extra ...func(*flag.FlagSet)) (
	cf *clusterFlags, ref, ns string, cl client.Client, err error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	cf = &clusterFlags{}
	cf.register(fs, withArchive)
	for _, add := range extra {
		add(fs)
	}
	pos, set, err := cmdline.Parse(cmd, fs, args, help)
	if err != nil {
		return nil, "", "", nil, err
	}
	if err := cf.validate(cmd, set); err != nil {
		return nil, "", "", nil, err
	}
	if ref, err = cmdline.OneReference(cmd, pos, what); err != nil {
		return nil, "", "", nil, err
	}
	if ns, err = namespace(&cf.common, c.env); err != nil {
		return nil, "", "", nil, err
	}
	if cl, err = kubeClient(&cf.common, c.env); err != nil {
		return nil, "", "", nil, err
	}
	return cf, ref, ns, cl, nil
}
