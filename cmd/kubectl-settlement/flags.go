package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// commonFlags are the flags every archive command takes.
type commonFlags struct {
	namespace     string
	allNamespaces bool
	databaseURL   string
	fromSecret    string
	kubeconfig    string
	kubeContext   string
	timeout       time.Duration
}

const commonHelp = `
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

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.namespace, "n", "", "")
	fs.StringVar(&c.namespace, "namespace", "", "")
	fs.BoolVar(&c.allNamespaces, "A", false, "")
	fs.BoolVar(&c.allNamespaces, "all-namespaces", false, "")
	fs.StringVar(&c.databaseURL, "database-url", "", "")
	fs.StringVar(&c.fromSecret, "from-secret", "", "")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "")
	fs.StringVar(&c.kubeContext, "context", "", "")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "")
}

func (c *commonFlags) validate(cmd string, setFlags map[string]bool) error {
	if c.allNamespaces && (setFlags["n"] || setFlags["namespace"]) {
		return usagef(cmd, "give --namespace or --all-namespaces, not both")
	}
	if setFlags["n"] || setFlags["namespace"] {
		if c.namespace == "" {
			return usagef(cmd, "--namespace needs a namespace")
		}
	}
	if c.databaseURL != "" && c.fromSecret != "" {
		return usagef(cmd, "give --database-url or --from-secret, not both")
	}
	if setFlags["database-url"] && c.databaseURL == "" {
		return usagef(cmd, "--database-url is empty")
	}
	if c.fromSecret != "" {
		if _, err := parseSecretRef(c.fromSecret); err != nil {
			return &usageError{cmd: cmd, err: err}
		}
	} else if setFlags["from-secret"] {
		return usagef(cmd, "--from-secret needs <namespace>/<name>[/<key>]")
	}
	if c.timeout <= 0 {
		return usagef(cmd, "--timeout must be positive, got %s", c.timeout)
	}
	return nil
}

// parse parses args with fs, allowing flags after positional arguments as kubectl does
// (`get REF -n ns`); "--" ends the flags. It returns the positional arguments and the
// names of the flags given.
func parse(cmd string, fs *flag.FlagSet, args []string, help string) ([]string, map[string]bool, error) {
	fs.SetOutput(io.Discard)
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, &helpRequested{text: help}
		}
		if err != nil {
			return nil, nil, &usageError{cmd: cmd, err: friendlyFlagError(err)}
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

// parseTime reads a --since or --until value: an RFC 3339 time, a date (midnight UTC),
// or a duration (24h, 90m, 7d) meaning that long before now.
func parseTime(flagName, v string, now time.Time) (time.Time, error) {
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

type secretRef struct{ namespace, name, key string }

func (r secretRef) String() string { return r.namespace + "/" + r.name }

func parseSecretRef(v string) (secretRef, error) {
	parts := strings.Split(v, "/")
	if len(parts) < 2 || len(parts) > 3 {
		return secretRef{}, fmt.Errorf("--from-secret %q: want <namespace>/<name>[/<key>]", v)
	}
	for _, p := range parts {
		if p == "" {
			return secretRef{}, fmt.Errorf("--from-secret %q: want <namespace>/<name>[/<key>], none of them empty", v)
		}
	}
	r := secretRef{namespace: parts[0], name: parts[1], key: "url"}
	if len(parts) == 3 {
		r.key = parts[2]
	}
	return r, nil
}
