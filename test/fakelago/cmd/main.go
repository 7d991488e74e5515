// Command fakelago runs the Lago fake (test/fakelago) as a process for the demo. Its
// first line on stdout is the URL to put in the BillingProvider's spec.endpoint; GET
// /_admin/effects on it answers each transaction_id's billed events.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	hooksv1alpha1 "github.com/settlement-operator/settlement-operator/api/v1alpha1"
	"github.com/settlement-operator/settlement-operator/test/fakelago"
)

func main() {
	var addr, apiKey, apiKeyFile, pipeline string
	var ingestDelay time.Duration
	flag.StringVar(&addr, "addr", "127.0.0.1:8093", "listen address")
	flag.StringVar(&apiKey, "api-key", "", "the organization's API key (prefer -api-key-file: flags show in ps); default "+fakelago.DefaultAPIKey)
	flag.StringVar(&apiKeyFile, "api-key-file", "", "file holding the API key")
	flag.StringVar(&pipeline, "pipeline", "Postgres", "the organization's event pipeline: Postgres or ClickHouse")
	flag.DurationVar(&ingestDelay, "ingest-delay", 0, "on ClickHouse, how long after it is accepted an event is visible to reads")
	flag.Parse()
	if pipeline != string(hooksv1alpha1.LagoPipelinePostgres) && pipeline != string(hooksv1alpha1.LagoPipelineClickHouse) {
		fmt.Fprintln(os.Stderr, "fakelago: -pipeline is Postgres or ClickHouse")
		os.Exit(2)
	}
	if apiKeyFile != "" {
		b, err := os.ReadFile(apiKeyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fakelago: read API key file:", err)
			os.Exit(1)
		}
		apiKey = strings.TrimSpace(string(b))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	s, err := fakelago.Start(fakelago.Options{Addr: addr, APIKey: apiKey,
		Pipeline: hooksv1alpha1.LagoEventPipeline(pipeline), IngestDelay: ingestDelay})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakelago:", err)
		os.Exit(1)
	}
	fmt.Println(s.URL())
	<-ctx.Done()
	s.Close()
}
