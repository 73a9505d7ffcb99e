package admithttp

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/admitkit/admit"
)

// A ClientIP finds the address of the client that sent a request, for a
// per-client key, believing a forwarding header only from proxies you
// trust. A client can write any X-Forwarded-For or Forwarded it likes; a
// limiter that believed it would give each forged value a bucket of its own.
//
// Without trusted proxies, the client is the peer (Request.RemoteAddr) and
// the header is never read. With them, when the peer is a trusted proxy,
// the header's addresses are read from the last (the one the nearest proxy
// added) toward the first, skipping trusted proxies; the first address that
// is not a trusted proxy is the client. When every address is trusted, the
// first is the client. An address may carry a port, as some load
// balancers send it ("198.51.100.9:1234", "[2001:db8::1]:443"). A value
// that is not an address (garbage, "unknown", an obfuscated Forwarded
// node, a port out of range) stops the walk: the trusted proxy that
// passed it on is the client, so forged values share that proxy's bucket
// instead of escaping the limit.
//
// A ClientIP is safe for use by multiple goroutines.
type ClientIP struct {
	header  string
	trusted []netip.Prefix
}

// NewClientIP returns a ClientIP that reads header, "X-Forwarded-For" or
// "Forwarded" (RFC 7239), from the proxies whose addresses are in
// trustedProxies, given as CIDR prefixes ("10.0.0.0/8", "2001:db8::/32")
// or single addresses. Name the header your proxies set: a proxy that sets
// X-Forwarded-For passes a client's Forwarded on unchanged, so the other
// header is never read. With no trusted proxy, header may be empty and is
// never read.
func NewClientIP(header string, trustedProxies ...string) (*ClientIP, error) {
	c := &ClientIP{header: http.CanonicalHeaderKey(header)}
	switch c.header {
	case "X-Forwarded-For", "Forwarded":
	case "":
		if len(trustedProxies) > 0 {
			return nil, fmt.Errorf("admithttp: NewClientIP: trusted proxies %q but no header; name the one they set, "+
				"\"X-Forwarded-For\" or \"Forwarded\"", trustedProxies)
		}
	default:
		return nil, fmt.Errorf("admithttp: NewClientIP: header %q; want \"X-Forwarded-For\" or \"Forwarded\"", header)
	}
	for _, s := range trustedProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil || a.Zone() != "" {
				return nil, fmt.Errorf("admithttp: NewClientIP: trusted proxy %q is neither a CIDR prefix (10.0.0.0/8) nor an address", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	return c, nil
}

// Key returns the client's address as a key part: an IPv4 address as
// written ("192.0.2.1"), an IPv6 address as its /64 prefix
// ("2001:db8:1:2::/64"), since one host is commonly given a whole /64; an
// IPv4-mapped IPv6 address as the IPv4 address. It never holds a brace,
// and is at most 43 bytes. A peer that is not an IP address (a Unix
// socket) gives "unknown": such requests share one key.
func (c *ClientIP) Key(r *http.Request) string {
	a, ok := c.Addr(r)
	if !ok {
		return "unknown"
	}
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Addr returns the client's address, unmapped and without zone, and true;
// or false when the peer is not an IP address.
func (c *ClientIP) Addr(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if !c.isTrusted(peer) {
		return peer, true
	}
	client := peer
	hops := forwardedFor(r.Header.Values(c.header), c.header == "Forwarded")
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseNode(hops[i], c.header == "Forwarded")
		if !ok {
			return client, true // garbage: the trusted proxy that passed it on
		}
		client = a
		if !c.isTrusted(a) {
			return a, true
		}
	}
	return client, true
}

func (c *ClientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// maxHops bounds the addresses read from a header: a client may send
// thousands; no real chain of proxies is that long.
const maxHops = 64

// forwardedFor returns the header's nodes in order: for X-Forwarded-For,
// the comma-separated elements; for Forwarded, the for= value of each
// element (an element without one counts as a node that is not an
// address). At most the last maxHops nodes are kept.
func forwardedFor(values []string, forwarded bool) []string {
	var hops []string
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			elem = strings.TrimSpace(elem)
			if forwarded {
				elem = forParam(elem)
			}
			hops = append(hops, elem)
			if len(hops) > 2*maxHops {
				hops = append(hops[:0], hops[len(hops)-maxHops:]...)
			}
		}
	}
	if len(hops) > maxHops {
		hops = hops[len(hops)-maxHops:]
	}
	return hops
}

// forParam returns the value of the for parameter of one Forwarded
// element ("for=192.0.2.60;proto=http"), unquoted, or "".
func forParam(elem string) string {
	for pair := range strings.SplitSeq(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, "for") {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// parseNode parses one node of a header: an address, optionally with a
// port as some load balancers send it ("198.51.100.9:1234",
// "[2001:db8::1]:443"); for Forwarded also a bracketed IPv6 address
// without a port, and an obfuscated port ("[2001:db8::1]:_p1").
func parseNode(s string, forwarded bool) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if !forwarded {
		return netip.Addr{}, false
	}
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		if host, _, err := net.SplitHostPort(s); err == nil {
			s = host
		} else {
			s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		}
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// parseHost parses a RemoteAddr: host:port, or a bare address.
func parseHost(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// PerClientIP returns a classify function for [New] that charges every
// request to one bucket of spec per client address, as ip finds it, under
// the key keyPrefix + ip.Key(r), named policy in refusals:
//
//	limit, err := admithttp.New(lim, admithttp.PerClientIP(ip, "per-ip", "rl:ip:", spec), outage)
//
// A nil ip means the peer's address (NewClientIP with no trusted proxy).
// A bad policy, keyPrefix or spec is found on the first request, which is
// answered 500, as any invalid Rule.
func PerClientIP(ip *ClientIP, policy, keyPrefix string, spec admit.Spec) func(*http.Request) Rule {
	if ip == nil {
		ip = &ClientIP{}
	}
	return func(r *http.Request) Rule {
		return Rule{First: Bucket{Policy: policy, Key: keyPrefix + ip.Key(r), Spec: spec}}
	}
}
