package admithttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/admitkit/admit"
	"github.com/admitkit/admit/admithttp"
)

func TestClientIPKey(t *testing.T) {
	long := strings.Repeat("10.0.0.9, ", 10000) + "10.0.0.9"
	for _, tc := range []struct {
		name    string
		header  string
		trusted []string
		remote  string
		values  []string // the header's lines
		want    string
	}{
		{"no-proxy-ignores-header", "", nil, "203.0.113.5:1234", nil, "203.0.113.5"},
		{"untrusted-peer-ignores-header", "X-Forwarded-For", []string{"10.0.0.0/8"}, "203.0.113.5:1234", []string{"1.2.3.4"}, "203.0.113.5"},
		{"trusted-peer", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"1.2.3.4"}, "1.2.3.4"},
		{"forged-first-element", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"6.6.6.6, 1.2.3.4"}, "1.2.3.4"},
		{"proxies-skipped", "X-Forwarded-For", []string{"10.0.0.0/8", "192.0.2.7"}, "10.0.0.1:1234", []string{"6.6.6.6, 1.2.3.4, 192.0.2.7, 10.1.1.1"}, "1.2.3.4"},
		{"lines-joined", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"6.6.6.6", "1.2.3.4, 10.0.0.3"}, "1.2.3.4"},
		{"all-trusted-first", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"10.0.0.4, 10.0.0.3"}, "10.0.0.4"},
		{"no-header-peer", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", nil, "10.0.0.1"},
		{"garbage-is-the-proxy", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"1.2.3.4, not-an-ip"}, "10.0.0.1"},
		{"garbage-behind-client", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"not-an-ip, 1.2.3.4"}, "1.2.3.4"},
		{"empty-element", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"1.2.3.4,,"}, "10.0.0.1"},
		{"huge-header-bounded", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"1.2.3.4, " + long}, "10.0.0.9"},
		{"ipv6-grouped-by-64", "", nil, "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::/64"},
		{"ipv6-same-64", "", nil, "[2001:db8:1:2:ffff::1%eth0]:443", nil, "2001:db8:1:2::/64"},
		{"ipv4-mapped", "", nil, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"ipv6-proxy-ipv6-client", "X-Forwarded-For", []string{"fd00::/8"}, "[fd00::1]:80", []string{"2001:db8:a:b::99"}, "2001:db8:a:b::/64"},
		{"forwarded", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234",
			[]string{`for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, For=10.0.0.2`}, "2001:db8:cafe::/64"},
		{"forwarded-port", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`for="192.0.2.60:8080"`}, "192.0.2.60"},
		{"forwarded-unknown", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`for=unknown`}, "10.0.0.1"},
		{"forwarded-obfuscated", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`for=_hidden;by=10.0.0.1`}, "10.0.0.1"},
		{"forwarded-no-for", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`proto=http`}, "10.0.0.1"},
		{"xff-ignored-when-forwarded-trusted", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", nil, "10.0.0.1"},
		{"unix-socket", "", nil, "@", nil, "unknown"},
		// Entries with a port, as some load balancers send them.
		{"xff-ipv4-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"198.51.100.9:1234"}, "198.51.100.9"},
		{"xff-ipv6-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"[2001:db8::1]:443"}, "2001:db8::/64"},
		{"xff-ports-past-proxies", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"6.6.6.6:1, 198.51.100.9:1234, 10.0.0.7:80"}, "198.51.100.9"},
		{"forwarded-ipv6-port", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`for="[2001:db8::1]:443"`}, "2001:db8::/64"},
		{"forwarded-ipv4-port-unquoted", "Forwarded", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{`for=198.51.100.9:1234`}, "198.51.100.9"},
		// Garbage with a port is still garbage: the proxy that passed it.
		{"xff-port-out-of-range", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"198.51.100.9:99999"}, "10.0.0.1"},
		{"xff-name-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"evil.example:80"}, "10.0.0.1"},
		{"xff-bare-ipv6-bracketed-no-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"[2001:db8::1]"}, "10.0.0.1"},
		{"xff-ipv6-unbracketed-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"2001:db8::1:443:x"}, "10.0.0.1"},
		{"xff-empty-port", "X-Forwarded-For", []string{"10.0.0.0/8"}, "10.0.0.1:1234", []string{"198.51.100.9:"}, "10.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := admithttp.NewClientIP(tc.header, tc.trusted...)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.values {
				r.Header.Add(tc.header, v)
			}
			if tc.name == "xff-ignored-when-forwarded-trusted" {
				r.Header.Set("X-Forwarded-For", "1.2.3.4")
			}
			got := c.Key(r)
			if got != tc.want {
				t.Errorf("Key = %q, want %q", got, tc.want)
			}
			if len(got) > 43 || strings.ContainsAny(got, "{}") {
				t.Errorf("Key %q: over 43 bytes or holds a brace", got)
			}
		})
	}
}

func TestNewClientIPRefuses(t *testing.T) {
	for _, tc := range []struct {
		header  string
		trusted []string
		says    string
	}{
		{"X-Real-IP", nil, "want \"X-Forwarded-For\" or \"Forwarded\""},
		{"", []string{"10.0.0.0/8"}, "no header"},
		{"X-Forwarded-For", []string{"10.0.0.0/33"}, "neither a CIDR prefix"},
		{"X-Forwarded-For", []string{"proxy.internal"}, "neither a CIDR prefix"},
	} {
		if _, err := admithttp.NewClientIP(tc.header, tc.trusted...); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NewClientIP(%q, %q): %v; want an error saying %q", tc.header, tc.trusted, err, tc.says)
		}
	}
	if _, err := admithttp.NewClientIP("x-forwarded-for", "10.0.0.1", "::ffff:10.0.0.0/104"); err != nil {
		t.Errorf("lower-case header, single address, mapped prefix: %v", err)
	}
}

// TestClientIPMappedProxy: a trusted prefix written IPv4-mapped trusts the
// IPv4 proxies it maps.
func TestClientIPMappedProxy(t *testing.T) {
	c, err := admithttp.NewClientIP("X-Forwarded-For", "::ffff:10.0.0.0/104")
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.9.9.9:80"
	r.Header.Set("X-Forwarded-For", "198.51.100.4")
	if got := c.Key(r); got != "198.51.100.4" {
		t.Errorf("Key = %q", got)
	}
}

// TestPerClientIP: one line gives each client, as the ClientIP finds it
// (behind a trusted proxy, with a port in X-Forwarded-For), a bucket of
// its own; a nil ClientIP keys on the peer.
func TestPerClientIP(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	local, err := admit.NewLocal(100, admit.WithLocalClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	ip, err := admithttp.NewClientIP("X-Forwarded-For", "10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	spec := admit.MustSpec(admit.Every(time.Second), 2)
	for _, tc := range []struct {
		name string
		ip   *admithttp.ClientIP
		reqs [][2]string // remote address, X-Forwarded-For
		want []int
	}{
		{"behind-proxy", ip, [][2]string{{"10.0.0.1:1", "198.51.100.9:1234"}, {"10.0.0.2:1", "198.51.100.9:999"}, {"10.0.0.1:1", "198.51.100.9"},
			{"10.0.0.1:1", "198.51.100.10:1234"}}, []int{200, 200, 429, 200}},
		{"peer", nil, [][2]string{{"203.0.113.5:1", "1.1.1.1"}, {"203.0.113.5:2", "2.2.2.2"}, {"203.0.113.5:3", "3.3.3.3"},
			{"203.0.113.6:1", ""}}, []int{200, 200, 429, 200}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw, err := admithttp.New(local, admithttp.PerClientIP(tc.ip, "per-ip", "rl:"+tc.name+":", spec), refuseAll)
			if err != nil {
				t.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			var got []int
			for _, rq := range tc.reqs {
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.RemoteAddr = rq[0]
				if rq[1] != "" {
					r.Header.Set("X-Forwarded-For", rq[1])
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				got = append(got, rec.Code)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("codes %v, want %v", got, tc.want)
			}
		})
	}
}
