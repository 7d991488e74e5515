// Command fake-billing runs the fake billing provider (docs/design.md §6.1), and optionally
// the fake job sink (§6.2), as a separate process for the demo and end-to-end tests.
// Faults are injected and the ledger read through the /_admin/ API:
//
//	fake-billing -addr 127.0.0.1:8091 -token-file token.txt -job-sink-addr 127.0.0.1:8092
//	curl -s -XPOST 127.0.0.1:8091/_admin/faults -d '{"commit_then_timeout_next":1}'
//	curl -s 127.0.0.1:8091/_admin/ledger
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/settlement-operator/settlement-operator/test/fakebilling"
	"github.com/settlement-operator/settlement-operator/test/fakejobsink"
)

func main() {
	var (
		addr, token, tokenFile, sinkAddr string
		pendingPolls, pageSize           int
		sinkRegisteredOnly, omitNulls    bool
	)
	flag.StringVar(&addr, "addr", "127.0.0.1:8091", "listen address of the billing provider")
	flag.StringVar(&token, "token", "", "required bearer token (prefer -token-file: flags show in ps); empty = no auth")
	flag.StringVar(&tokenFile, "token-file", "", "file holding the bearer token")
	flag.IntVar(&pendingPolls, "pending-polls", 0, "GETs a new record stays pending before it settles (0 = settled at once)")
	flag.IntVar(&pageSize, "page-size", 100, "List page size")
	flag.BoolVar(&omitNulls, "omit-nulls", false, "leave null fields out of the records it answers with (also POST /_admin/record-format)")
	flag.StringVar(&sinkAddr, "job-sink-addr", "", "also run the fake job sink on this address (empty = off); it uses the same token")
	flag.BoolVar(&sinkRegisteredOnly, "job-sink-registered-only", false, "job sink answers 404 for jobs until registered via POST /_admin/register")
	flag.Parse()

	if err := run(addr, token, tokenFile, sinkAddr, pendingPolls, pageSize, sinkRegisteredOnly, omitNulls); err != nil {
		fmt.Fprintln(os.Stderr, "fake-billing:", err)
		os.Exit(1)
	}
}

func run(addr, token, tokenFile, sinkAddr string, pendingPolls, pageSize int, sinkRegisteredOnly, omitNulls bool) error {
	if token != "" && tokenFile != "" {
		return errors.New("use -token or -token-file, not both")
	}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("read token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	provider, err := fakebilling.Start(fakebilling.Options{Token: token, Addr: addr, PendingPolls: pendingPolls, PageSize: pageSize,
		OmitNulls: omitNulls})
	if err != nil {
		return fmt.Errorf("start billing provider: %w", err)
	}
	fmt.Printf("fake billing provider listening on %s\n", provider.URL())

	var sink *fakejobsink.Server
	if sinkAddr != "" {
		known := fakejobsink.AllJobs
		if sinkRegisteredOnly {
			known = fakejobsink.OnlyRegistered
		}
		if sink, err = fakejobsink.Start(fakejobsink.Options{Token: token, Addr: sinkAddr, KnownJobs: known}); err != nil {
			return errors.Join(fmt.Errorf("start job sink: %w", err), provider.Close())
		}
		fmt.Printf("fake job sink listening on %s\n", sink.URL())
	}

	<-ctx.Done()
	fmt.Println("fake-billing: shutting down")
	errs := []error{provider.Close()}
	if sink != nil {
		errs = append(errs, sink.Close())
	}
	return errors.Join(errs...)
}
