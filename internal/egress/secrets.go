package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// SecretSource resolves a secret a rule references, for the sandbox whose request it is.
type SecretSource interface {
	Secret(ctx context.Context, sandboxID, name string) (string, error)
}

// templatePart is a literal or a secret reference of a header template.
type templatePart struct {
	literal string
	secret  string
}

// parseTemplate splits a header value into literals and {{secret:NAME}}
// references. Every "{{" opens a reference; anything but secret:NAME
// inside the braces, or a "{{" never closed, is an error.
func parseTemplate(s string) ([]templatePart, error) {
	var parts []templatePart
	for {
		before, after, found := strings.Cut(s, "{{")
		if before != "" {
			parts = append(parts, templatePart{literal: before})
		}
		if !found {
			return parts, nil
		}
		inner, rest, closed := strings.Cut(after, "}}")
		if !closed {
			return nil, errors.New("template: \"{{\" without \"}}\"")
		}
		name, ok := strings.CutPrefix(inner, "secret:")
		if !ok || !validSecretName(name) {
			return nil, fmt.Errorf("template: {{%s}}: want {{secret:NAME}} with NAME matching [a-z0-9][a-z0-9._-]{0,62}", inner)
		}
		parts = append(parts, templatePart{secret: name})
		s = rest
	}
}

// secretError is a secret that could not be resolved for a request. Its
// message names the secret, never a value.
type secretError struct {
	name string
	err  error
}

func (e *secretError) Error() string {
	return fmt.Sprintf("corral: secret %q for this request is unavailable: %v", e.name, e.err)
}

func (e *secretError) Unwrap() error { return e.err }

var errNoSecretStore = errors.New("no secret store")

// injection is what the proxy changes in one request: headers to set and
// placeholders to replace, with the secrets already resolved.
type injection struct {
	headers [][2]string       // name, value
	replace []replacement     // in header values
	body    []replacement     // in the body as well
	stray   []PlaceholderRule // placeholders that must not be replaced here
}

type replacement struct{ old, new string }

// injectionFor resolves what policy p injects into a request for host.
// Secrets are looked up on every call, so rotation needs no restart.
func (sb *sandbox) injectionFor(ctx context.Context, p *Policy, host string) (*injection, error) {
	inj := &injection{}
	resolved := map[string]string{}
	secret := func(name string) (string, error) {
		if v, ok := resolved[name]; ok {
			return v, nil
		}
		src := sb.srv.cfg.Secrets
		if src == nil {
			return "", &secretError{name: name, err: errNoSecretStore}
		}
		v, err := src.Secret(ctx, sb.id, name)
		if err != nil {
			return "", &secretError{name: name, err: err}
		}
		if strings.ContainsAny(v, "\r\n\x00") {
			return "", &secretError{name: name, err: errors.New("its value cannot be sent in a header")}
		}
		resolved[name] = v
		return v, nil
	}
	for _, h := range p.headersFor(host) {
		parts, err := parseTemplate(h.Value)
		if err != nil {
			return nil, err // Normalize checked it already
		}
		var b strings.Builder
		for _, part := range parts {
			if part.secret == "" {
				b.WriteString(part.literal)
				continue
			}
			v, err := secret(part.secret)
			if err != nil {
				return nil, err
			}
			b.WriteString(v)
		}
		inj.headers = append(inj.headers, [2]string{h.Name, b.String()})
	}
	match, other := p.placeholdersFor(host)
	for _, r := range match {
		v, err := secret(r.Secret)
		if err != nil {
			return nil, err
		}
		rep := replacement{old: r.Placeholder, new: v}
		inj.replace = append(inj.replace, rep)
		if r.Body {
			inj.body = append(inj.body, rep)
		}
	}
	inj.stray = other
	return inj, nil
}

// apply changes an outbound request: placeholders first, then the rule
// headers, which replace whatever the sandbox sent. A body that may
// change is streamed through a replacer and sent without a length.
func (inj *injection) apply(out *http.Request) {
	if len(inj.replace) > 0 {
		for _, vs := range out.Header {
			for i, v := range vs {
				for _, r := range inj.replace {
					v = strings.ReplaceAll(v, r.old, r.new)
				}
				vs[i] = v
			}
		}
	}
	for _, h := range inj.headers {
		out.Header.Set(h[0], h[1])
	}
	if len(inj.body) > 0 && out.Body != nil && out.Body != http.NoBody && out.ContentLength != 0 {
		out.Body = &replacingBody{r: newReplacer(out.Body, inj.body), c: out.Body}
		out.ContentLength = -1
		out.Header.Del("Content-Length")
	}
}

// strays returns the env names of placeholders of other domains found in
// the request's header values; they are sent as they are.
func (inj *injection) strays(r *http.Request) []string {
	var envs []string
	for _, p := range inj.stray {
		found := false
		for _, vs := range r.Header {
			for _, v := range vs {
				found = found || strings.Contains(v, p.Placeholder)
			}
		}
		if found {
			envs = append(envs, p.Env)
		}
	}
	return envs
}

type replacingBody struct {
	r io.Reader
	c io.Closer
}

func (b *replacingBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *replacingBody) Close() error               { return b.c.Close() }

// replacer replaces fixed strings in a stream. It holds back the last
// longest-pattern-minus-one bytes of what it has read until more arrive,
// so a match split across reads is still found, and buffers at most one
// read chunk plus that tail.
type replacer struct {
	src   io.Reader
	reps  []replacement
	keep  int
	in    []byte // read, not yet scanned
	out   []byte // scanned, not yet returned
	chunk []byte
	err   error // from src; io.EOF at the end
}

const replaceChunk = 32 << 10

func newReplacer(src io.Reader, reps []replacement) *replacer {
	keep := 0
	for _, r := range reps {
		keep = max(keep, len(r.old)-1)
	}
	return &replacer{src: src, reps: reps, keep: keep, chunk: make([]byte, replaceChunk)}
}

func (r *replacer) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil && len(r.in) == 0 {
			return 0, r.err
		}
		if r.err == nil {
			n, err := r.src.Read(r.chunk)
			r.in = append(r.in, r.chunk[:n]...)
			r.err = err
		}
		r.scan()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// scan moves what can no longer be part of an unfinished match from in to
// out, replacing matches. Every match that starts before limit ends
// within in, so it is found whole.
func (r *replacer) scan() {
	limit := len(r.in)
	if r.err == nil {
		limit = max(0, len(r.in)-r.keep)
	}
	out := r.out[:0]
	i := 0
	for i < limit {
		at, which := -1, -1
		for k, rep := range r.reps {
			if j := bytes.Index(r.in[i:], []byte(rep.old)); j >= 0 && (at < 0 || j < at) {
				at, which = j, k
			}
		}
		if at < 0 || i+at >= limit {
			out = append(out, r.in[i:limit]...)
			i = limit
			break
		}
		out = append(out, r.in[i:i+at]...)
		out = append(out, r.reps[which].new...)
		i += at + len(r.reps[which].old)
	}
	r.out = out
	r.in = append(r.in[:0], r.in[i:]...)
}
