package e2b

import (
	"crypto/subtle"
	"net/http"
	"strconv"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/server"
)

// servePort forwards a request for a sandbox port other than envd's
// (a <port>-<id>.<domain> host, or E2b-Sandbox-Port) to that port of the
// sandbox, as E2B's proxy does for Sandbox.getHost(port). Unlike E2B,
// where such traffic is public unless the sandbox was created with
// allowPublicTraffic false, Corral always asks for a credential: the
// sandbox's access token (E2b-Traffic-Access-Token or X-Access-Token) or
// the API key. The credential headers are removed before forwarding.
func (s *Server) servePort(w http.ResponseWriter, r *http.Request, id, port string) {
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "port %q: want a number from 1 to 65535", port))
		return
	}
	tok := r.Header.Get("E2b-Traffic-Access-Token")
	// A connection proxied with an API key ends when the key is revoked
	// (envdAuth); one with the access token outlives the key.
	authed, stop, ok := s.envdAuth(r, id)
	defer stop()
	if ok {
		r = authed
	} else if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.accessToken(id))) != 1 {
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrUnauthenticated,
			"missing or invalid credential for port %d of sandbox %s: send E2b-Traffic-Access-Token (the sandbox's access token) or X-API-Key", n, id))
		return
	}
	for _, h := range []string{"E2b-Traffic-Access-Token", "X-Access-Token", "X-API-Key", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
		r.Header.Del(h)
	}
	// A bearer token that is an API key (any team's) stays out of the
	// sandbox.
	if _, ok := server.Credentials(r.Header, "Bearer"); ok {
		if _, _, isKey := s.key(r); isKey {
			r.Header.Del("Authorization")
		}
	}
	s.ports.Forward(w, r, id, n, r.URL.EscapedPath(), "")
}
