package server

import (
	"net"
	"net/http"
	"net/url"
	"strings"
)

// originPolicy says which Host and Origin headers the server accepts. A
// server without an API key trusts whoever can reach it, so it must not be
// reachable from web pages the user visits: a page on another origin may
// not drive it (a foreign Origin is refused), and neither may a page whose
// name the attacker points at the server (DNS rebinding: a Host that is not
// the server's own name is refused). A key protects by itself, since
// browsers do not send it for a page.
type originPolicy struct {
	keyed     bool   // an API key is required: no Host or Origin checks
	boundHost string // the listen address's host, lower case
	boundIP   net.IP // the same when it is an IP
	anyIP     bool   // listening on every interface: any IP names the server
	hosts     map[string]bool
	origins   map[string]bool // lower case; "*" allows any
}

func newOriginPolicy(opts Options) originPolicy {
	p := originPolicy{keyed: opts.APIKey != "", hosts: map[string]bool{}, origins: map[string]bool{}}
	if opts.Addr != "" {
		p.boundHost = hostName(opts.Addr)
		p.boundIP = net.ParseIP(p.boundHost)
		p.anyIP = p.boundHost == "" || (p.boundIP != nil && p.boundIP.IsUnspecified())
	}
	for _, h := range opts.AllowedHosts {
		p.hosts[hostName(h)] = true
	}
	for _, o := range opts.AllowedOrigins {
		p.origins[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	return p
}

// hostName is the host of a Host header or address, without port,
// brackets or final dot, in lower case.
func hostName(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), "."))
}

// hostAllowed reports whether a Host names this server: loopback names and
// addresses always do (a page cannot own them), and so do the listen
// address and the allowed hosts. Any IP does when the server listens on
// every interface: reaching it by IP is not rebinding.
func (p *originPolicy) hostAllowed(host string) bool {
	h := hostName(host)
	switch {
	case h == "", h == "localhost", strings.HasSuffix(h, ".localhost"), h == p.boundHost, p.hosts[h], p.hosts["*"]:
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && (ip.IsLoopback() || p.anyIP)
}

// listed reports whether an origin is in the allow-list.
func (p *originPolicy) listed(origin string) bool {
	return origin != "" && (p.origins["*"] || p.origins[strings.ToLower(origin)])
}

// check refuses a keyless request whose Host is not the server's or whose
// Origin is foreign, and marks answers to allowed origins for browsers (CORS).
func (p *originPolicy) check(w http.ResponseWriter, r *http.Request) error {
	origin := r.Header.Get("Origin")
	if p.listed(origin) {
		w.Header().Set("Access-Control-Allow-Origin", origin)
		w.Header().Add("Vary", "Origin")
	}
	if p.keyed {
		return nil
	}
	if !p.hostAllowed(r.Host) {
		return newError(http.StatusForbidden, invalidRequest, "forbidden_host", "",
			"the Host %q does not name this server, which has no API key: use its address or localhost; behind a proxy, add the proxy's name to --allowed-hosts (or set --api-key)", r.Host)
	}
	if origin == "" || p.listed(origin) {
		return nil
	}
	if u, err := url.Parse(origin); err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host) {
		return nil // the server's own page
	}
	return newError(http.StatusForbidden, invalidRequest, "forbidden_origin", "",
		"requests from the web origin %q are refused by this server, which has no API key: add the origin to --allowed-origins (or set --api-key)", origin)
}

// preflight answers a browser's CORS preflight (an OPTIONS request before
// a cross-origin one) and reports whether r was one. Allowed origins get
// the methods and headers they ask for; others are refused.
func (p *originPolicy) preflight(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if r.Method != http.MethodOptions || origin == "" || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	if !p.listed(origin) {
		writeError(w, newError(http.StatusForbidden, invalidRequest, "forbidden_origin", "",
			"cross-origin requests from %q are refused: add the origin to --allowed-origins", origin))
		return true
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	h.Set("Access-Control-Allow-Methods", "GET, POST")
	if asked := r.Header.Get("Access-Control-Request-Headers"); asked != "" {
		h.Set("Access-Control-Allow-Headers", asked) // the official clients send several of their own
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}
