// Command fakemetronome runs the Metronome fake (test/fakemetronome) as a process for
// the demo. Its URL is the first line on stdout; GET /_admin/effects answers a JSON
// object of each transaction ID's effect count:
//
//	go run ./test/fakemetronome/cmd -addr 127.0.0.1:8093 -token-file token.txt
//	curl -s 127.0.0.1:8093/_admin/effects
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

	"github.com/settlement-operator/settlement-operator/test/fakemetronome"
)

func main() {
	var addr, token, tokenFile string
	flag.StringVar(&addr, "addr", "127.0.0.1:0", "listen address")
	flag.StringVar(&token, "token", "", "bearer token every call must carry (prefer -token-file: flags show in ps); empty = "+fakemetronome.DefaultToken)
	flag.StringVar(&tokenFile, "token-file", "", "file holding the bearer token")
	flag.Parse()
	if err := run(addr, token, tokenFile); err != nil {
		fmt.Fprintln(os.Stderr, "fakemetronome:", err)
		os.Exit(1)
	}
}

func run(addr, token, tokenFile string) error {
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
	s, err := fakemetronome.Start(fakemetronome.Options{Addr: addr, Token: token})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Println(s.URL())
	<-ctx.Done()
	return nil
}
