package corral

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"
)

// Template is a root file system that sandboxes start from.
type Template struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
}

// Templates lists templates by name.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out []Template
	if err := c.doJSON(ctx, "GET", "/v1/templates", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// ImportTemplate makes a template from a rootfs tarball (plain or gzip).
func (c *Client) ImportTemplate(ctx context.Context, name string, tarball io.Reader) (*Template, error) {
	resp, err := c.do(ctx, "PUT", "/v1/templates/"+url.PathEscape(name), nil, tarball, "application/x-tar")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var t Template
	if err := decodeJSON(resp.Body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// BuildOptions choose a template recipe.
type BuildOptions struct {
	// Recipe is "debian" (a Debian userland for coding agents, built with
	// debootstrap) or "busybox" (tiny, for tests).
	Recipe         string `json:"recipe"`
	Mirror         string `json:"mirror,omitempty"`
	BuildEssential bool   `json:"build_essential,omitempty"`
}

// BuildTemplate builds a template on the daemon, copying its log lines to
// progress (if not nil) as they arrive.
func (c *Client) BuildTemplate(ctx context.Context, name string, opts BuildOptions, progress io.Writer) (*Template, error) {
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/build", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64*1024), 4<<20)
	for sc.Scan() {
		var ev struct {
			Type     string    `json:"type"`
			Text     string    `json:"text"`
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
			if progress != nil {
				fmt.Fprintln(progress, ev.Text)
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

// DeleteTemplate removes a template no sandbox uses.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.doJSON(ctx, "DELETE", "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// Runtime describes an isolation runtime the daemon offers.
type Runtime struct {
	Name         string `json:"name"`
	Default      bool   `json:"default"`
	Capabilities struct {
		Pause      bool   `json:"pause"`
		Checkpoint bool   `json:"checkpoint"`
		Isolation  string `json:"isolation"`
	} `json:"capabilities"`
}

// Version describes the daemon.
type Version struct {
	Version  string    `json:"version"`
	Storage  string    `json:"storage"`
	Runtimes []Runtime `json:"runtimes"`
}

// Version asks the daemon what it is and offers.
func (c *Client) Version(ctx context.Context) (*Version, error) {
	var v Version
	if err := c.doJSON(ctx, "GET", "/v1/version", nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}
