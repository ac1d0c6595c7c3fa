package agentserver

import (
	"net/http"
	"slices"
	"strings"
)

// routes is the agent's request router: a map from method and path to
// handler, where a path below /processes/ has its first element, the PID,
// replaced by {pid} and given to the handler as the path value "pid".
// http.ServeMux did the same, but registering the agent's routes with it
// parses every pattern and checks it against the others at each sandbox's
// start, and a sandbox cannot answer before its agent is up. As with ServeMux, GET routes answer HEAD, a known path with
// another method gets 405 with Allow, and anything else 404.
type routes struct {
	handlers map[string]http.HandlerFunc // "METHOD path"
	methods  map[string][]string         // path: its methods, for Allow
}

func newRoutes() *routes {
	return &routes{handlers: map[string]http.HandlerFunc{}, methods: map[string][]string{}}
}

// handle routes method and path (literal, or with {pid} as its second
// element below /processes) to h.
func (rt *routes) handle(method, path string, h http.HandlerFunc) {
	rt.handlers[method+" "+path] = h
	rt.methods[path] = append(rt.methods[path], method)
	if method == http.MethodGet {
		rt.handlers[http.MethodHead+" "+path] = h
		rt.methods[path] = append(rt.methods[path], http.MethodHead)
	}
}

func (rt *routes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/processes/"); ok {
		pid, sub, hasSub := strings.Cut(rest, "/")
		if pid != "" {
			r.SetPathValue("pid", pid)
			path = "/processes/{pid}"
			if hasSub {
				path += "/" + sub
			}
		}
	}
	if h, ok := rt.handlers[r.Method+" "+path]; ok {
		h(w, r)
		return
	}
	if methods, ok := rt.methods[path]; ok {
		methods = slices.Clone(methods)
		slices.Sort(methods)
		w.Header().Set("Allow", strings.Join(methods, ", "))
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	http.NotFound(w, r)
}
