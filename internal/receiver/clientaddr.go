package receiver

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ParseTrustedProxies parses --receiver-trusted-proxies: comma-separated CIDRs (a bare
// IP is one address) of the proxies whose X-Forwarded-For the receiver believes. Empty
// means none: the source address is always the TCP peer's.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q is neither a CIDR (10.0.0.0/8) nor an IP address", f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// clientAddress is the source a delivery's unauthenticated work is counted against
// (docs/design.md §15): the TCP peer's IP, unless the peer is a trusted proxy; then
// X-Forwarded-For is walked from the right, past every trusted proxy, and the first
// hop that is not one is the client. Everything left of that hop was written by
// whoever the client is and is ignored, so a client cannot choose its own address by
// sending the header. A hop that is not an address ends the walk at the trusted hop
// to its right (a proxy we trust wrote something we cannot read: we count against
// that proxy rather than guess). IPv6 clients are counted per /64, the block one
// subscriber usually holds, so one host cannot multiply its slots by its addresses.
func clientAddress(remoteAddr string, xff []string, trusted []netip.Prefix) string {
	peer, ok := parseHop(remoteAddr)
	if !ok {
		// Not an IP peer (a unix socket, a test's ResponseRecorder): one shared bucket.
		return "unknown"
	}
	client := peer
	if isTrusted(peer, trusted) {
		hops := splitHops(xff)
	walk:
		for i := len(hops) - 1; i >= 0; i-- {
			hop, ok := parseHop(hops[i])
			switch {
			case !ok:
				break walk
			case !isTrusted(hop, trusted):
				client = hop
				break walk
			default:
				// A trusted proxy: the hop to its left is what it saw.
				client = hop
			}
		}
	}
	if client.Is6() {
		return netip.PrefixFrom(client, 64).Masked().String()
	}
	return client.String()
}

// splitHops flattens every X-Forwarded-For header, in order, into its hops.
func splitHops(values []string) []string {
	var hops []string
	for _, v := range values {
		for _, h := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(h))
		}
	}
	return hops
}

// parseHop reads "ip", "ip:port" or "[ipv6]:port" (RemoteAddr, and what some proxies
// write); IPv4-mapped IPv6 is read as IPv4, and a zone is dropped.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap(), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// sourceOf is clientAddress for a request.
func (r *Receiver) sourceOf(req *http.Request) string {
	return clientAddress(req.RemoteAddr, req.Header.Values("X-Forwarded-For"), r.opts.TrustedProxies)
}
