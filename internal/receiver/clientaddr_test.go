package receiver

import (
	"net/netip"
	"testing"
)

func TestClientAddress(t *testing.T) {
	trusted, err := ParseTrustedProxies("10.0.0.0/8, 192.168.1.7,fd00::/8")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		remote  string
		xff     []string
		trusted []netip.Prefix
		want    string
	}{
		{name: "no proxies trusted: the peer", remote: "203.0.113.5:4711", want: "203.0.113.5"},
		{name: "no proxies trusted: the header is ignored", remote: "203.0.113.5:4711",
			xff: []string{"198.51.100.1"}, want: "203.0.113.5"},
		{name: "spoofed header from an untrusted peer is ignored", remote: "203.0.113.5:4711",
			xff: []string{"10.1.2.3, 198.51.100.1"}, trusted: trusted, want: "203.0.113.5"},
		{name: "spoofed header naming a trusted proxy from an untrusted peer is ignored", remote: "203.0.113.5:4711",
			xff: []string{"10.1.2.3"}, trusted: trusted, want: "203.0.113.5"},
		{name: "trusted proxy: the hop it saw", remote: "10.0.0.9:80",
			xff: []string{"198.51.100.1"}, trusted: trusted, want: "198.51.100.1"},
		{name: "trusted proxy: hops the client wrote left of the real one are ignored", remote: "10.0.0.9:80",
			xff: []string{"1.2.3.4, 5.6.7.8, 198.51.100.1"}, trusted: trusted, want: "198.51.100.1"},
		{name: "a chain of trusted proxies is walked from the right", remote: "10.0.0.9:80",
			xff: []string{"7.7.7.7, 198.51.100.1, 192.168.1.7, 10.3.3.3"}, trusted: trusted, want: "198.51.100.1"},
		{name: "several headers are one list, in order", remote: "10.0.0.9:80",
			xff: []string{"7.7.7.7, 198.51.100.1", "10.3.3.3"}, trusted: trusted, want: "198.51.100.1"},
		{name: "trusted proxy without the header: the proxy itself", remote: "10.0.0.9:80",
			trusted: trusted, want: "10.0.0.9"},
		{name: "every hop trusted: the left-most", remote: "10.0.0.9:80",
			xff: []string{"10.5.5.5, 10.3.3.3"}, trusted: trusted, want: "10.5.5.5"},
		{name: "garbage ends the walk at the trusted hop to its right", remote: "10.0.0.9:80",
			xff: []string{"198.51.100.1, not-an-ip, 10.3.3.3"}, trusted: trusted, want: "10.3.3.3"},
		{name: "garbage as the only hop: the proxy", remote: "10.0.0.9:80",
			xff: []string{"unknown"}, trusted: trusted, want: "10.0.0.9"},
		{name: "empty hop ends the walk", remote: "10.0.0.9:80",
			xff: []string{"198.51.100.1,,"}, trusted: trusted, want: "10.0.0.9"},
		{name: "hop with a port", remote: "10.0.0.9:80",
			xff: []string{"198.51.100.1:5555"}, trusted: trusted, want: "198.51.100.1"},
		{name: "IPv4-mapped IPv6 peer is IPv4", remote: "[::ffff:203.0.113.5]:4711", want: "203.0.113.5"},
		{name: "IPv6 peer is counted per /64", remote: "[2001:db8:1:2:aaaa::1]:4711", want: "2001:db8:1:2::/64"},
		{name: "IPv6 hop behind an IPv6 trusted proxy, per /64", remote: "[fd00::9]:80",
			xff: []string{"2001:db8:1:2:bbbb::7"}, trusted: trusted, want: "2001:db8:1:2::/64"},
		{name: "bracketed IPv6 hop with a port", remote: "10.0.0.9:80",
			xff: []string{"[2001:db8:1:2::7]:443"}, trusted: trusted, want: "2001:db8:1:2::/64"},
		{name: "IPv6 peer with a zone", remote: "[fe80::1%eth0]:4711", want: "fe80::/64"},
		{name: "not an IP peer: one shared bucket", remote: "@", want: "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clientAddress(tc.remote, tc.xff, tc.trusted); got != tc.want {
				t.Errorf("clientAddress(%q, %q) = %q, want %q", tc.remote, tc.xff, got, tc.want)
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "", want: nil},
		{in: " , ", want: nil},
		{in: "10.0.0.0/8", want: []string{"10.0.0.0/8"}},
		{in: "10.1.2.3/8,192.168.0.1", want: []string{"10.0.0.0/8", "192.168.0.1/32"}},
		{in: "fd00::/8, ::1", want: []string{"fd00::/8", "::1/128"}},
		{in: "::ffff:10.0.0.1", want: []string{"10.0.0.1/32"}},
		{in: "10.0.0.0/33", wantErr: true},
		{in: "proxy.example.com", wantErr: true},
		{in: "10.0.0.0/8,nope", wantErr: true},
	} {
		got, err := ParseTrustedProxies(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseTrustedProxies(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		var s []string
		for _, p := range got {
			s = append(s, p.String())
		}
		if len(s) != len(tc.want) {
			t.Errorf("ParseTrustedProxies(%q) = %v, want %v", tc.in, s, tc.want)
			continue
		}
		for i := range s {
			if s[i] != tc.want[i] {
				t.Errorf("ParseTrustedProxies(%q) = %v, want %v", tc.in, s, tc.want)
			}
		}
	}
}
