package corral

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/textproto"
	"net/url"
	"sort"
)

// TemplateDefaults say how processes run in a template's sandboxes, from
// the configuration of the image it came from: an exec's environment is
// Env, then the sandbox's, then the exec's own; WorkingDir and User apply
// when an exec names none. Entrypoint, Cmd and Labels are informational.
type TemplateDefaults struct {
	Env        []string          `json:"env,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

// Progress is one report about one blob of a pull: a first one with
// Current 0 (or a single one with Cached), growing Current, then one with
// Done. Reports for different blobs interleave.
type Progress struct {
	// Action is what happens, e.g. "pulling layer"; ID is the blob's
	// digest.
	Action string `json:"action"`
	ID     string `json:"id"`
	// Current and Total count bytes; Total is -1 when unknown.
	Current int64 `json:"current"`
	Total   int64 `json:"total"`
	Cached  bool  `json:"cached,omitempty"`
	Done    bool  `json:"done,omitempty"`
}

// StreamOptions say where the events of a pull or build go. Both
// callbacks run on the calling goroutine.
type StreamOptions struct {
	// Log, if not nil, receives the log lines.
	Log io.Writer
	// Progress, if not nil, receives transfer progress.
	Progress func(Progress)
}

// PullOptions say what PullTemplate pulls.
type PullOptions struct {
	// Ref is the image reference, e.g. "python:3.12".
	Ref string `json:"ref"`
	// Platform picks an image of a multi-platform index ("linux/arm64");
	// empty means linux/amd64.
	Platform string `json:"platform,omitempty"`
	// Insecure allows plain HTTP to the registry.
	Insecure bool `json:"insecure,omitempty"`
	// Service, if set, is the template's service; the image's own CMD
	// and ENTRYPOINT never start by themselves.
	Service *Service `json:"service,omitempty"`
}

// PullTemplate pulls an image on the daemon and makes template name from
// it; the image's configuration becomes the template's Defaults. The
// daemon reads registry credentials from its own docker config file.
func (c *Client) PullTemplate(ctx context.Context, name string, opts PullOptions, stream StreamOptions) (*Template, error) {
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/pull", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuildStream(resp.Body, stream)
}

// DockerfileOptions are the inputs of BuildTemplateFromDockerfile.
type DockerfileOptions struct {
	// Dockerfile is the build file's content.
	Dockerfile []byte
	// ContextDir, when set, is a local directory sent as the build
	// context (as WriteTar writes it: owners are not kept). Context, when
	// set instead, is a tar stream (plain or gzip) of the context. With
	// neither the context is empty.
	ContextDir string
	Context    io.Reader
	// Args are build arguments (--build-arg), overriding ARG defaults.
	Args map[string]string
	// Platform and Insecure apply to pulling the FROM image.
	Platform string
	Insecure bool
	// NoCache runs every step even when its result is cached.
	NoCache bool
	// Network is the network mode of RUN steps: "none" (the default:
	// loopback only), "allowlist" (the default when AllowDomains is set)
	// or "open". AllowDomains are the names they may reach through the
	// egress proxy ("*.example.com" for the names below it).
	Network      string
	AllowDomains []string
	// Service says what the template starts.
	Service DockerfileService
}

// BuildTemplateFromDockerfile builds template name on the daemon from a
// Dockerfile (the subset FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG,
// CMD, ENTRYPOINT, LABEL). RUN steps run in sandboxes, by default without
// network (opts.Network); step results are cached, so an unchanged rebuild runs nothing. Step
// lines and RUN output go to stream.Log, the FROM pull's progress to
// stream.Progress. A Dockerfile the daemon refuses is CodeInvalidArgument
// naming the line; a failing RUN step is CodeFailedPrecondition naming the
// step and its exit status.
func (c *Client) BuildTemplateFromDockerfile(ctx context.Context, name string, opts DockerfileOptions, stream StreamOptions) (*Template, error) {
	if opts.ContextDir != "" && opts.Context != nil {
		return nil, errors.New("set ContextDir or Context, not both")
	}
	q := url.Values{}
	keys := make([]string, 0, len(opts.Args))
	for k := range opts.Args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("build_arg", k+"="+opts.Args[k])
	}
	if opts.Platform != "" {
		q.Set("platform", opts.Platform)
	}
	if opts.Insecure {
		q.Set("insecure", "true")
	}
	if opts.NoCache {
		q.Set("no_cache", "true")
	}
	if opts.Network != "" {
		q.Set("network", opts.Network)
	}
	for _, d := range opts.AllowDomains {
		q.Add("allow_domain", d)
	}
	opts.Service.query(q)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan error, 1)
	go func() {
		err := writeBuildBody(mw, opts)
		_ = pw.CloseWithError(err)
		done <- err
	}()
	resp, err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/build", q, pr, mw.FormDataContentType())
	// Ends the writer if the request stopped reading early.
	ended := errors.New("build request ended")
	_ = pr.CloseWithError(ended)
	// A body that could not be made (an unreadable context directory)
	// explains a failed request better than the request's own error.
	if werr := <-done; werr != nil && !errors.Is(werr, ended) && !errors.Is(werr, io.ErrClosedPipe) {
		if err == nil {
			resp.Body.Close()
		}
		return nil, fmt.Errorf("sending the build: %w", werr)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readBuildStream(resp.Body, stream)
}

// writeBuildBody writes the multipart body of a Dockerfile build: the
// dockerfile part, then the context.
func writeBuildBody(mw *multipart.Writer, opts DockerfileOptions) error {
	fw, err := mw.CreateFormFile("dockerfile", "Dockerfile")
	if err != nil {
		return err
	}
	if _, err := fw.Write(opts.Dockerfile); err != nil {
		return err
	}
	if opts.ContextDir != "" || opts.Context != nil {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="context"; filename="context.tar"`)
		h.Set("Content-Type", "application/x-tar")
		cw, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		if opts.ContextDir != "" {
			err = WriteTar(cw, opts.ContextDir)
		} else {
			_, err = io.Copy(cw, opts.Context)
		}
		if err != nil {
			return fmt.Errorf("archiving build context: %w", err)
		}
	}
	return mw.Close()
}

// readBuildStream reads the NDJSON events of a build or pull until its
// last one.
func readBuildStream(body io.Reader, stream StreamOptions) (*Template, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		var ev struct {
			Type     string    `json:"type"`
			Text     string    `json:"text"`
			Progress *Progress `json:"progress"`
			Template *Template `json:"template"`
			Error    *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decoding build event: %w", err)
		}
		switch ev.Type {
		case "log":
			if stream.Log != nil {
				fmt.Fprintln(stream.Log, ev.Text)
			}
		case "progress":
			if stream.Progress != nil && ev.Progress != nil {
				stream.Progress(*ev.Progress)
			}
		case "done":
			return ev.Template, nil
		case "error":
			if ev.Error == nil {
				return nil, &Error{Status: 200, Code: CodeInternal, Message: "build failed"}
			}
			return nil, &Error{Status: 200, Code: ev.Error.Code, Message: ev.Error.Message}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading build stream: %w", err)
	}
	return nil, &Error{Code: CodeUnavailable, Message: "build stream ended without a result"}
}
