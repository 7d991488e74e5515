// Package cmdline is the kubectl plugin's command line: the flags every archive
// command takes, their parsing (flags after positional arguments, as kubectl allows),
// and the errors a wrong command line or a help request give. Every command parses its
// arguments here, so that all of them read and refuse a command line alike.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Flags are the flags every archive command takes. They are shared so that the
// namespace, the kubeconfig and the archive are found alike by every command; the
// cluster commands fill them too, through their own flags.
type Flags struct {
	// Namespace is --namespace: the namespace to search ("" when not given).
	Namespace string
	// AllNamespaces is --all-namespaces: search every namespace.
	AllNamespaces bool
	// DatabaseURL is --database-url: the archive's URL or DSN, a secret.
	DatabaseURL string
	// FromSecret is --from-secret: the Secret holding the archive's URL, NS/NAME[/KEY].
	FromSecret string
	// Kubeconfig is --kubeconfig: a kubeconfig file other than kubectl's default.
	Kubeconfig string
	// KubeContext is --context: a kubeconfig context other than the current one.
	KubeContext string
	// Timeout is --timeout: the bound on each SQL statement or API request.
	Timeout time.Duration
}

// CommonHelp is the help text of Flags, shared by every archive command's help so
// that each documents them the same way.
const CommonHelp = `
Namespace:
  -n, --namespace NS        the namespace to search (default: the kubeconfig context's
                            namespace, or "default")
  -A, --all-namespaces      every namespace

Archive database (the first given of):
  --database-url URL        a PostgreSQL URL or DSN (visible to other users in ps: prefer
                            the next two)
  --from-secret NS/NAME[/KEY]
                            read the URL from the Secret the operator uses, key "url" by
                            default, through the kubeconfig
  SETTLEMENT_ARCHIVE_URL    environment variable holding the URL
  The URL and its password are never printed, not even in errors. The session is
  read-only: this command never writes to the archive.

Kubernetes (for the default namespace and --from-secret):
  --kubeconfig FILE         default: $KUBECONFIG, then ~/.kube/config
  --context NAME            a kubeconfig context other than the current one

  --timeout DURATION        bound on each SQL statement (default 30s)

Exit status: 0 done, 1 nothing found or the archive could not be read, 2 a wrong
command line or configuration.
`

// Register adds the flags to fs, so that every archive command spells them alike.
func (c *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Namespace, "n", "", "")
	fs.StringVar(&c.Namespace, "namespace", "", "")
	fs.BoolVar(&c.AllNamespaces, "A", false, "")
	fs.BoolVar(&c.AllNamespaces, "all-namespaces", false, "")
	fs.StringVar(&c.DatabaseURL, "database-url", "", "")
	fs.StringVar(&c.FromSecret, "from-secret", "", "")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&c.KubeContext, "context", "", "")
	fs.DurationVar(&c.Timeout, "timeout", 30*time.Second, "")
}

// Validate refuses, as a usage error of cmd, the combinations and values of the
// flags that cannot be run; setFlags are the names of the flags given (from Parse).
// It runs before anything is read, so a wrong command line never reaches the cluster
// or the archive.
func (c *Flags) Validate(cmd string, setFlags map[string]bool) error {
	if c.AllNamespaces && (setFlags["n"] || setFlags["namespace"]) {
		return Usagef(cmd, "give --namespace or --all-namespaces, not both")
	}
	if setFlags["n"] || setFlags["namespace"] {
		if c.Namespace == "" {
			return Usagef(cmd, "--namespace needs a namespace")
		}
	}
	if c.DatabaseURL != "" && c.FromSecret != "" {
		return Usagef(cmd, "give --database-url or --from-secret, not both")
	}
	if setFlags["database-url"] && c.DatabaseURL == "" {
		return Usagef(cmd, "--database-url is empty")
	}
	if c.FromSecret != "" {
		if _, err := ParseSecretRef(c.FromSecret); err != nil {
			return &UsageError{Cmd: cmd, Err: err}
		}
	} else if setFlags["from-secret"] {
		return Usagef(cmd, "--from-secret needs <namespace>/<name>[/<key>]")
	}
	if c.Timeout <= 0 {
		return Usagef(cmd, "--timeout must be positive, got %s", c.Timeout)
	}
	return nil
}

// Parse parses args with fs, allowing flags after positional arguments as kubectl does
// (`get REF -n ns`); "--" ends the flags. It returns the positional arguments and the
// names of the flags given. -h and --help give a HelpRequested carrying help; any other
// flag error is a UsageError of cmd.
func Parse(cmd string, fs *flag.FlagSet, args []string, help string) ([]string, map[string]bool, error) {
	fs.SetOutput(io.Discard)
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, &HelpRequested{Text: help}
		}
		if err != nil {
			return nil, nil, &UsageError{Cmd: cmd, Err: friendlyFlagError(err)}
		}
		rest := fs.Args()
		consumed := args[:len(args)-len(rest)]
		if n := len(consumed); n > 0 && consumed[n-1] == "--" && !(n >= 2 && takesValue(fs, consumed[n-2])) {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return positional, set, nil
}

// takesValue reports whether arg is a flag that consumed the next argument as its value.
func takesValue(fs *flag.FlagSet, arg string) bool {
	if !strings.HasPrefix(arg, "-") || strings.Contains(arg, "=") {
		return false
	}
	f := fs.Lookup(strings.TrimLeft(arg, "-"))
	if f == nil {
		return false
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return false
	}
	return true
}

func friendlyFlagError(err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		return fmt.Errorf("unknown flag %s", name)
	}
	return errors.New(msg)
}

// ParseTime reads a --since or --until value: an RFC 3339 time, a date (midnight UTC),
// or a duration (24h, 90m, 7d) meaning that long before now. It is shared so that every
// time window on the command line is read alike.
func ParseTime(flagName, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, fmt.Errorf("--%s is empty", flagName)
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	var d time.Duration
	var err error
	if days, ok := strings.CutSuffix(v, "d"); ok {
		var n int64
		n, err = strconv.ParseInt(days, 10, 32)
		d = time.Duration(n) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(v)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: want an RFC 3339 time (2026-11-01T00:00:00Z), a date (2026-11-01) or a duration before now (24h, 7d)", flagName, v)
	}
	if d <= 0 {
		return time.Time{}, fmt.Errorf("--%s %q: a duration means that long ago and must be positive", flagName, v)
	}
	return now.Add(-d).UTC(), nil
}

// SecretRef is a --from-secret value: the Secret, and the key of it, that holds the
// archive's URL, so the URL need not be typed (and shown in ps).
type SecretRef struct {
	// Namespace is the Secret's namespace.
	Namespace string
	// Name is the Secret's name.
	Name string
	// Key is the key of the Secret's data holding the URL ("url" unless given).
	Key string
}

// String is the Secret as messages name it: namespace/name, never a value.
func (r SecretRef) String() string { return r.Namespace + "/" + r.Name }

// ParseSecretRef reads a --from-secret value, <namespace>/<name>[/<key>]; both Validate
// and the command that reads the Secret use it, so they agree on what it names.
func ParseSecretRef(v string) (SecretRef, error) {
	parts := strings.Split(v, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return SecretRef{}, fmt.Errorf("--from-secret %q: want <namespace>/<name>[/<key>]", v)
	}
	for _, p := range parts {
		if p == "" {
			return SecretRef{}, fmt.Errorf("--from-secret %q: want <namespace>/<name>[/<key>], none of them empty", v)
		}
	}
	r := SecretRef{Namespace: parts[0], Name: parts[1], Key: "url"}
	if len(parts) == 3 {
		r.Key = parts[2]
	}
	return r, nil
}

// OneReference is the single positional argument of keys, trace, replay and refund:
// what is missing (described by what), more than one, or an empty one is a usage error.
func OneReference(cmd string, pos []string, what string) (string, error) {
	switch {
	case len(pos) == 0:
		return "", Usagef(cmd, "give %s", what)
	case len(pos) > 1:
		return "", Usagef(cmd, "give one reference, got %d: %s", len(pos), strings.Join(pos, " "))
	case pos[0] == "":
		return "", Usagef(cmd, "the reference is empty")
	}
	return pos[0], nil
}
