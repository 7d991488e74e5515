// Package archivedb is the kubectl plugin's access to the operator's PostgreSQL
// archive: where its URL comes from (a flag, a Secret or the environment), a
// read-only store on it, and the redactor that keeps the URL and its password out of
// every message. It is separate from the archive's own package because these are the
// plugin's choices: read-only, and secrets never printed.
package archivedb

import (
	"context"
	"errors"
	"net/url"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/settlement-operator/settlement-operator/internal/archive"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/cmdline"
	"github.com/settlement-operator/settlement-operator/internal/kubectlplugin/kube"
)

// EnvArchiveURL names the environment variable that holds the archive's URL, the way to
// give it without a flag (visible in ps) or a Secret.
const EnvArchiveURL = "SETTLEMENT_ARCHIVE_URL"

// databaseURL is the archive's URL: --database-url, else the Secret of --from-secret,
// else $SETTLEMENT_ARCHIVE_URL.
func databaseURL(ctx context.Context, cmd string, c *cmdline.Flags, env func(string) string) (string, error) {
	switch {
	case c.DatabaseURL != "":
		return c.DatabaseURL, nil
	case c.FromSecret != "":
		ref, err := cmdline.ParseSecretRef(c.FromSecret)
		if err != nil {
			return "", &cmdline.UsageError{Cmd: cmd, Err: err}
		}
		return kube.SecretValue(ctx, c, env, ref)
	case env(EnvArchiveURL) != "":
		return env(EnvArchiveURL), nil
	}
	return "", cmdline.Usagef(cmd, "no archive database: give --database-url, --from-secret <namespace>/<name>[/<key>], or set %s", EnvArchiveURL)
}

// Open opens a read-only store on the archive and checks its schema, so that no
// command of the plugin can write to the archive or misread an older one. From here on
// every error message goes through red, which knows the URL.
func Open(ctx context.Context, cmd string, c *cmdline.Flags, env func(string) string, red *Redactor) (*archive.Store, error) {
	u, err := databaseURL(ctx, cmd, c, env)
	if err != nil {
		return nil, err
	}
	red.Add(u)
	store, err := archive.Open(archive.Config{URL: u, ReadOnly: true, ApplicationName: "kubectl-settlement",
		MaxConns: 2, StatementTimeout: c.Timeout})
	if err != nil {
		// The URL is input to the command as much as a flag is.
		return nil, &cmdline.UsageError{Cmd: cmd, Err: err}
	}
	if err := store.CheckSchema(ctx); err != nil {
		store.Close()
		if errors.Is(err, archive.ErrNotReady) {
			return nil, err
		}
		return nil, errors.New("cannot read the archive: " + err.Error())
	}
	return store, nil
}

// Redactor removes the archive's URL and password from messages. pgx's own messages
// never carry the password, but a driver, a proxy or a future version might; the
// redactor does not depend on it. Its zero value redacts nothing.
type Redactor struct{ secrets []string }

// Add makes the redactor remove dbURL, its password and their escaped forms, once the
// URL is known.
func (r *Redactor) Add(dbURL string) {
	candidates := []string{dbURL}
	if u, err := url.Parse(dbURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok {
			candidates = append(candidates, p, url.QueryEscape(p), url.PathEscape(p), u.User.String())
		}
	}
	if cfg, err := pgconn.ParseConfig(dbURL); err == nil {
		candidates = append(candidates, cfg.Password)
	}
	for _, s := range candidates {
		if s != "" {
			r.secrets = append(r.secrets, s)
		}
	}
	// Longest first, so that the URL goes as a whole before its password is looked for.
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
}

// Clean is msg with every secret added replaced by [REDACTED]; every error message
// the plugin prints passes through it.
func (r *Redactor) Clean(msg string) string {
	for _, s := range r.secrets {
		msg = strings.ReplaceAll(msg, s, "[REDACTED]")
	}
	return msg
}
