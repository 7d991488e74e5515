package kube

import (
	"flag"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// Flags are the flags of the commands that read (or, for replay and refund, write to)
// the cluster: keys, trace, replay and refund. They fill a cmdline.Flags so that the
// namespace and the kubeconfig are found exactly as the archive commands find them.
type Flags struct {
	// Common holds the namespace, kubeconfig, timeout and (for trace) archive flags.
	Common cmdline.Flags
	// Provider is --provider: the WebhookProvider whose names are derived ("" for all).
	Provider string
}

// Help is the help text of Flags, shared by the cluster commands' helps so that each
// documents them the same way.
const Help = `
Cluster:
  -n, --namespace NS        the namespace (default: the kubeconfig context's namespace,
                            or "default")
  --provider NAME           the WebhookProvider whose names are derived (default: every
                            WebhookProvider in the namespace)
  --kubeconfig FILE         default: $KUBECONFIG, then ~/.kube/config
  --context NAME            a kubeconfig context other than the current one
  --timeout DURATION        bound on each request (default 30s)
`

// Register adds the cluster flags; withArchive adds the archive's flags too (trace).
func (c *Flags) Register(fs *flag.FlagSet, withArchive bool) {
	fs.StringVar(&c.Common.Namespace, "n", "", "")
	fs.StringVar(&c.Common.Namespace, "namespace", "", "")
	fs.StringVar(&c.Common.Kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&c.Common.KubeContext, "context", "", "")
	fs.DurationVar(&c.Common.Timeout, "timeout", 30*time.Second, "")
	fs.StringVar(&c.Provider, "provider", "", "")
	if withArchive {
		fs.StringVar(&c.Common.DatabaseURL, "database-url", "", "")
		fs.StringVar(&c.Common.FromSecret, "from-secret", "", "")
	}
}

// Validate refuses, as a usage error of cmd, what cmdline.Flags.Validate refuses and
// an empty --provider, before anything is read from the cluster.
func (c *Flags) Validate(cmd string, set map[string]bool) error {
	if err := c.Common.Validate(cmd, set); err != nil {
		return err
	}
	if set["provider"] && c.Provider == "" {
		return cmdline.Usagef(cmd, "--provider needs a WebhookProvider name")
	}
	return nil
}

// Start is how trace, replay and refund start: their flags parsed and checked, the
// one reference they take (described by what, for the error when it is missing), the
// namespace and a client. extra adds a command's own flags. env stands for os.Getenv.
func Start(env func(string) string, cmd string, args []string, withArchive bool, help, what string, extra ...func(*flag.FlagSet)) (
	cf *Flags, ref, ns string, cl client.Client, err error) {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	cf = &Flags{}
	cf.Register(fs, withArchive)
	for _, add := range extra {
		add(fs)
	}
	pos, set, err := cmdline.Parse(cmd, fs, args, help)
	if err != nil {
		return nil, "", "", nil, err
	}
	if err := cf.Validate(cmd, set); err != nil {
		return nil, "", "", nil, err
	}
	if ref, err = cmdline.OneReference(cmd, pos, what); err != nil {
		return nil, "", "", nil, err
	}
	if ns, err = Namespace(&cf.Common, env); err != nil {
		return nil, "", "", nil, err
	}
	if cl, err = Client(&cf.Common, env); err != nil {
		return nil, "", "", nil, err
	}
	return cf, ref, ns, cl, nil
}
