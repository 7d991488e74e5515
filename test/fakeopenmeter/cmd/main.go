// Command fakeopenmeter runs the OpenMeter fake as a process for the demo: it prints
// its URL on stdout's first line, serves OpenMeter's events API, and GET
// /_admin/effects answers each event id's effect count.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/settlement-operator/settlement-operator/test/fakeopenmeter"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on")
	token := flag.String("token", fakeopenmeter.Token, "bearer token required (empty: none; prefer -token-file: flags show in ps)")
	tokenFile := flag.String("token-file", "", "file holding the bearer token (overrides -token)")
	dedup := flag.Duration("deduplication", 0, "deduplication window by source and id (0: none, a self-hosted install's default)")
	flag.Parse()
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fakeopenmeter:", err)
			os.Exit(1)
		}
		*token = strings.TrimSpace(string(b))
	}
	s, err := fakeopenmeter.Start(fakeopenmeter.Options{Addr: *addr, Token: *token, Deduplication: *dedup})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeopenmeter:", err)
		os.Exit(1)
	}
	fmt.Println(s.URL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	s.Close()
}
