// Command send-webhook signs a JSON payload like a real provider and posts it to the
// receiver, printing the answer. Used by the demo and handy for trying a provider:
//
//	send-webhook -url http://127.0.0.1:8090/webhooks/default/inference \
//	  -scheme StandardWebhooks -secret-file secret.txt -id msg_1 -data '{"type":"job.completed",...}'
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/settlement-operator/settlement-operator/internal/signature"
	"github.com/settlement-operator/settlement-operator/test/sender"
)

type headerFlags http.Header

func (h headerFlags) String() string { return "" }
func (h headerFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want Name=value, got %q", v)
	}
	http.Header(h).Add(k, val)
	return nil
}

// orderedHeaders keeps Name=value flags in the order given: signed headers are signed
// in that order.
type orderedHeaders struct{ ordered [][2]string }

func (o *orderedHeaders) String() string { return "" }
func (o *orderedHeaders) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" || val == "" {
		return fmt.Errorf("want Name=value, got %q", v)
	}
	for _, kv := range o.ordered {
		if strings.EqualFold(kv[0], k) {
			return fmt.Errorf("%s is given twice", k)
		}
	}
	o.ordered = append(o.ordered, [2]string{k, val})
	return nil
}

func main() {
	var (
		url, scheme, secret, secretFile, id, data, prefix, encoding, header, tsHeader string
		skew                                                                          time.Duration
		headers                                                                       = headerFlags{}
		signed                                                                        = &orderedHeaders{}
	)
	flag.StringVar(&url, "url", "", "receiver URL, e.g. http://127.0.0.1:8090/webhooks/<namespace>/<provider> (required)")
	flag.StringVar(&scheme, "scheme", signature.SchemeStandardWebhooks, "StandardWebhooks, Stripe, HMACSHA256 or APIKey (senders EventBridge and CloudEvents: -signature-header names the credential header, the secret is its value)")
	flag.StringVar(&secret, "secret", "", "signing secret (prefer -secret-file: flags show in ps)")
	flag.StringVar(&secretFile, "secret-file", "", "file holding the signing secret")
	flag.StringVar(&id, "id", "", "webhook-id for StandardWebhooks (default: msg_<unix nanos>)")
	flag.StringVar(&data, "data", "", "JSON payload, or @file to read it from a file (required)")
	flag.StringVar(&header, "signature-header", "", "HMACSHA256: header carrying the signature; APIKey: header carrying the credential")
	flag.StringVar(&prefix, "signature-prefix", "", "HMACSHA256: prefix before the signature, e.g. sha256=")
	flag.StringVar(&encoding, "signature-encoding", "", "HMACSHA256: Hex (default) or Base64")
	flag.StringVar(&tsHeader, "timestamp-header", "", "HMACSHA256: header carrying the signed unix timestamp")
	flag.DurationVar(&skew, "clock-skew", 0, "sign with now+skew (e.g. -6m to try an old delivery)")
	flag.Var(headers, "H", "extra header Name=value (repeatable; not signed)")
	flag.Var(signed, "signed-header", "HMACSHA256: a header signed with the body, Name=value, in the WebhookProvider's "+
		"signature.signedHeaders order (repeatable; CloudEvents binary mode: -signed-header ce-id=... -signed-header ce-type=...)")
	flag.Parse()

	if err := run(url, scheme, secret, secretFile, id, data, header, prefix, encoding, tsHeader, skew, http.Header(headers),
		signed.ordered); err != nil {
		fmt.Fprintln(os.Stderr, "send-webhook:", err)
		os.Exit(1)
	}
}

func run(url, scheme, secret, secretFile, id, data, header, prefix, encoding, tsHeader string,
	skew time.Duration, extra http.Header, signed [][2]string) error {
	if url == "" || data == "" {
		return fmt.Errorf("-url and -data are required (see -h)")
	}
	if secretFile != "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return fmt.Errorf("read secret: %w", err)
		}
		secret = string(b)
	}
	if secret == "" {
		return fmt.Errorf("a secret is required: -secret-file or -secret")
	}
	body := []byte(data)
	if strings.HasPrefix(data, "@") {
		b, err := os.ReadFile(data[1:])
		if err != nil {
			return fmt.Errorf("read payload: %w", err)
		}
		body = b
	}
	if id == "" {
		id = fmt.Sprintf("msg_%d", time.Now().UnixNano())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := signature.Config{Scheme: scheme, Header: header, Prefix: prefix, Encoding: encoding, TimestampHeader: tsHeader}
	values := http.Header{}
	for _, kv := range signed {
		cfg.SignedHeaders = append(cfg.SignedHeaders, kv[0])
		values.Set(kv[0], kv[1])
	}
	resp, err := sender.Send(ctx, &http.Client{Timeout: 30 * time.Second}, sender.Delivery{
		URL: url, ID: id, Body: body, Secret: []byte(strings.TrimSpace(secret)), Header: extra,
		Timestamp: time.Now().Add(skew), Signature: cfg, Signed: values,
	})
	if err != nil {
		return err
	}
	fmt.Printf("%d %s", resp.Status, resp.Body)
	if resp.Status >= 300 {
		return fmt.Errorf("receiver answered %d", resp.Status)
	}
	return nil
}
