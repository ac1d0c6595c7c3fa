package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	corral "github.com/corralrun/corral/sdk"
)

// Limits of files_read and files_list.
const (
	defaultRead = 20_000
	maxRead     = 1 << 20
	// maxImage is the largest image files_read returns as an image.
	maxImage    = 5 << 20
	maxListings = 500
)

// ReadIn is the input of files_read.
type ReadIn struct {
	Path      string `json:"path" jsonschema:"absolute path of the file"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
	Offset    int64  `json:"offset,omitempty" jsonschema:"byte offset to start at; default 0"`
	Length    int    `json:"length,omitempty" jsonschema:"bytes to read; default 20000, at most 1048576"`
}

func (s *Server) filesRead(ctx context.Context, st *session, in ReadIn) (*mcp.CallToolResult, error) {
	if in.Path == "" {
		return nil, invalid("path is required")
	}
	if in.Offset < 0 {
		return nil, invalid("offset must not be negative")
	}
	length := in.Length
	switch {
	case length == 0:
		length = defaultRead
	case length < 0 || length > maxRead:
		return nil, invalid("length must be between 1 and %d", maxRead)
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	fi, err := statTarget(ctx, st.client, id, in.Path)
	if err != nil {
		return nil, err
	}
	if fi.Type == corral.FileTypeDir {
		return nil, invalid("%s is a directory; list it with files_list", in.Path)
	}
	r, err := st.client.ReadFile(ctx, id, in.Path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// Images come whole, as images, when they are small enough.
	if in.Offset == 0 && fi.Size <= maxImage {
		head := make([]byte, 512)
		n, _ := io.ReadFull(r, head)
		head = head[:n]
		if mime := http.DetectContentType(head); isImage(mime) {
			rest, err := io.ReadAll(io.LimitReader(r, maxImage))
			if err != nil {
				return nil, fmt.Errorf("reading %s: %w", in.Path, err)
			}
			data := append(head, rest...)
			return &mcp.CallToolResult{Content: []mcp.Content{
				&mcp.TextContent{Text: fmt.Sprintf("%s: %s, %d bytes\n", in.Path, mime, len(data))},
				&mcp.ImageContent{Data: data, MIMEType: mime}},
				StructuredContent: map[string]any{"sandbox_id": id, "path": in.Path, "size": len(data), "mime_type": mime}}, nil
		}
		r = readCloser{io.MultiReader(bytes.NewReader(head), r), r}
	}
	if _, err := io.CopyN(io.Discard, r, in.Offset); err != nil && err != io.EOF {
		return nil, fmt.Errorf("reading %s: %w", in.Path, err)
	}
	// One byte more than asked says whether more follows.
	buf, err := io.ReadAll(io.LimitReader(r, int64(length)+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", in.Path, err)
	}
	more := len(buf) > length
	if more {
		// A cut inside a character moves to its start, so text stays
		// valid and the next read begins with the whole character.
		buf = cutRune(buf[:length])
	}
	end := in.Offset + int64(len(buf))
	size := max(fi.Size, end)
	structured := map[string]any{"sandbox_id": id, "path": in.Path, "size": size, "offset": in.Offset, "end": end}
	var b strings.Builder
	if utf8.Valid(buf) {
		b.Write(buf)
		structured["content"] = string(buf)
		structured["encoding"] = "text"
	} else {
		enc := base64.StdEncoding.EncodeToString(buf)
		fmt.Fprintf(&b, "(binary content, base64)\n%s", enc)
		structured["content"] = enc
		structured["encoding"] = "base64"
	}
	if in.Offset > 0 || more {
		if !strings.HasSuffix(b.String(), "\n") {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "[bytes %d to %d of %d", in.Offset, end, size)
		if more {
			fmt.Fprintf(&b, "; read on with offset=%d", end)
		}
		b.WriteString("]\n")
	}
	return textResult(b.String(), structured), nil
}

// statTarget describes the file at p, following symbolic links (the API's
// stat describes a link itself) up to a depth the kernel would also
// refuse.
func statTarget(ctx context.Context, c *corral.Client, id, p string) (*corral.FileInfo, error) {
	for range 40 {
		fi, err := c.Stat(ctx, id, p)
		if err != nil || fi.Type != corral.FileTypeSymlink {
			return fi, err
		}
		if path.IsAbs(fi.Target) {
			p = fi.Target
		} else {
			p = path.Join(path.Dir(p), fi.Target)
		}
	}
	return nil, invalid("too many levels of symbolic links at %s", p)
}

// cutRune drops an incomplete character at the end of b, unless that
// would leave nothing (a part shorter than one character).
func cutRune(b []byte) []byte {
	for cut := len(b); cut > 0 && cut > len(b)-utf8.UTFMax; cut-- {
		if utf8.RuneStart(b[cut-1]) {
			if !utf8.FullRune(b[cut-1:]) && cut > 1 {
				return b[:cut-1]
			}
			break
		}
	}
	return b
}

type readCloser struct {
	io.Reader
	io.Closer
}

func isImage(mime string) bool {
	switch mime {
	case "image/png", "image/jpeg", "image/gif", "image/webp":
		return true
	}
	return false
}

func decodeBase64(s string) ([]byte, error) {
	return base64.StdEncoding.DecodeString(strings.TrimSpace(s))
}

// WriteIn is the input of files_write.
type WriteIn struct {
	Path      string `json:"path" jsonschema:"absolute path of the file"`
	Content   string `json:"content" jsonschema:"the file's content"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"text (default) or base64, for binary content"`
	Mode      string `json:"mode,omitempty" jsonschema:"permissions in octal, e.g. 755 for a script; default 644"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) filesWrite(ctx context.Context, st *session, in WriteIn) (*mcp.CallToolResult, error) {
	if in.Path == "" {
		return nil, invalid("path is required")
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "text", "utf-8", "utf8":
	case "base64":
		var err error
		if data, err = decodeBase64(in.Content); err != nil {
			return nil, invalid("content is not valid base64: %v", err)
		}
	default:
		return nil, invalid("encoding %q is not text or base64", in.Encoding)
	}
	mode := os.FileMode(0o644)
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, invalid("mode %q is not octal permissions such as 644", in.Mode)
		}
		mode = os.FileMode(m)
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	fi, err := st.client.WriteFile(ctx, id, in.Path, bytes.NewReader(data), mode)
	if err != nil {
		return nil, err
	}
	return textResult(fmt.Sprintf("wrote %d bytes to %s\n", fi.Size, fi.Path),
		map[string]any{"sandbox_id": id, "path": fi.Path, "size": fi.Size}), nil
}

// PathIn names a path.
type PathIn struct {
	Path      string `json:"path" jsonschema:"absolute path"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) filesList(ctx context.Context, st *session, in PathIn) (*mcp.CallToolResult, error) {
	if in.Path == "" {
		return nil, invalid("path is required")
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	entries, err := st.client.ListDir(ctx, id, in.Path)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	items := []map[string]any{}
	for i, e := range entries {
		if i == maxListings {
			fmt.Fprintf(&b, "[... %d more entries left out; list a subdirectory, or use exec with ls or find]\n", len(entries)-maxListings)
			break
		}
		name := e.Name
		switch e.Type {
		case corral.FileTypeDir:
			name += "/"
		case corral.FileTypeSymlink:
			name += " -> " + e.Target
		}
		fmt.Fprintf(&b, "%-7s %10d  %s\n", e.Type, e.Size, name)
		items = append(items, map[string]any{"name": e.Name, "type": e.Type, "size": e.Size})
	}
	if len(entries) == 0 {
		b.WriteString("(empty directory)\n")
	}
	return textResult(b.String(), map[string]any{"sandbox_id": id, "path": in.Path, "entries": items, "count": len(entries)}), nil
}

// RemoveIn is the input of files_remove.
type RemoveIn struct {
	Path      string `json:"path" jsonschema:"absolute path"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"remove a directory and everything in it"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"default: this session's own sandbox"`
}

func (s *Server) filesRemove(ctx context.Context, st *session, in RemoveIn) (*mcp.CallToolResult, error) {
	if in.Path == "" {
		return nil, invalid("path is required")
	}
	id, err := s.sandboxFor(ctx, st, in.SandboxID)
	if err != nil {
		return nil, err
	}
	if err := st.client.Remove(ctx, id, in.Path, in.Recursive); err != nil {
		return nil, err
	}
	return textResult("removed "+in.Path+"\n", map[string]any{"sandbox_id": id, "path": in.Path, "removed": true}), nil
}
