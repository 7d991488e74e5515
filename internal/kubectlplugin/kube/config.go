// Package kube is the kubectl plugin's access to the cluster: the kubeconfig found as
// kubectl finds it, the flags of the commands that read the cluster, a client, and the
// reads and lookups those commands share (a read that tells "absent" from "not
// allowed", the namespace's webhook providers, a settlement by any of its references).
// It never writes; the commands that do (replay, refund) write through its client.
package kube

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
)

// kubeConfig is the kubeconfig as kubectl finds it: --kubeconfig, else $KUBECONFIG (a
// list of files), else ~/.kube/config; --context overrides the current context.
func kubeConfig(c *cmdline.Flags, env func(string) string) clientcmd.ClientConfig {
	rules := &clientcmd.ClientConfigLoadingRules{}
	switch {
	case c.Kubeconfig != "":
		rules.ExplicitPath = c.Kubeconfig
	case env("KUBECONFIG") != "":
		rules.Precedence = filepath.SplitList(env("KUBECONFIG"))
	case env("HOME") != "":
		rules.Precedence = []string{filepath.Join(env("HOME"), ".kube", "config")}
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.KubeContext})
}

// Namespace is the namespace to search: "" for --all-namespaces, --namespace, else the
// kubeconfig context's namespace, else "default" (also when there is no kubeconfig), so
// that every command defaults as kubectl does.
func Namespace(c *cmdline.Flags, env func(string) string) (string, error) {
	switch {
	case c.AllNamespaces:
		return "", nil
	case c.Namespace != "":
		return c.Namespace, nil
	}
	ns, _, err := kubeConfig(c, env).Namespace()
	if clientcmd.IsEmptyConfig(err) {
		return "default", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the kubeconfig for the default namespace (or give --namespace): %w", err)
	}
	if ns == "" {
		ns = "default"
	}
	return ns, nil
}

// SecretValue reads one key of a Secret through the kubeconfig, for --from-secret:
// the archive's URL then never appears on a command line. Messages name the Secret and
// its keys, never a value.
func SecretValue(ctx context.Context, c *cmdline.Flags, env func(string) string, ref cmdline.SecretRef) (string, error) {
	cfg, err := kubeConfig(c, env).ClientConfig()
	if err != nil {
		return "", fmt.Errorf("--from-secret: read the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-settlement"
	cfg.Timeout = 30 * time.Second
	client, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("--from-secret: %w", err)
	}
	sec, err := client.Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("--from-secret: secret %q not found in namespace %q", ref.Name, ref.Namespace)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("--from-secret: not allowed to read secret %s (check: kubectl auth can-i get secret/%s -n %s)", ref, ref.Name, ref.Namespace)
	case err != nil:
		return "", fmt.Errorf("--from-secret: read secret %s: %w", ref, err)
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		keys := make([]string, 0, len(sec.Data))
		for k := range sec.Data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		return "", fmt.Errorf("--from-secret: secret %s has no key %q (its keys: %s)", ref, ref.Key, strings.Join(keys, ", "))
	}
	url := strings.TrimSpace(string(v))
	if url == "" {
		return "", fmt.Errorf("--from-secret: key %q of secret %s is empty", ref.Key, ref)
	}
	return url, nil
}
