package e2b

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/corralrun/corral/internal/agentclient"
	"github.com/corralrun/corral/internal/errdefs"
)

// This file serves envd's REST file endpoints (envd's spec/envd.yaml):
// GET /files?path=P downloads a file, POST /files uploads one or more
// (multipart/form-data with "file" parts, or the raw body with
// Content-Type application/octet-stream), streamed through the agent in
// both directions. Files are written with mode 0644 and owned by root: the
// agent writes as the daemon's user, whatever "username" says.

// uploadEntry is envd's EntryInfo of an upload answer.
type uploadEntry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

func (s *Server) files(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	user := q.Get("username")
	if sig := q.Get("signature"); sig != "" {
		_, stop, ok := s.envdAuth(r, id)
		stop()
		if !ok {
			op := map[string]string{http.MethodGet: "read", http.MethodPost: "write"}[r.Method]
			if err := s.checkSignature(id, q.Get("path"), op, user, sig, q.Get("signature_expiration")); err != nil {
				s.writeAPIError(w, r, err)
				return
			}
		}
	}
	cl, err := s.agent(id)
	if err != nil {
		s.writeAPIError(w, r, err)
		return
	}
	switch r.Method {
	case http.MethodGet:
		p := resolvePath(q.Get("path"), user)
		rc, size, err := cl.ReadFile(r.Context(), p)
		if err != nil {
			s.writeAPIError(w, r, err)
			return
		}
		sendFile(w, rc, size, p)
	case http.MethodPost:
		entries, err := upload(r, cl)
		if err != nil {
			if errors.Is(err, errdefs.ErrResourceExhausted) {
				writeJSON(w, http.StatusInsufficientStorage, apiError{Code: http.StatusInsufficientStorage, Message: s.redact(r, err).Error()})
				return
			}
			s.writeAPIError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, entries)
	default:
		s.writeAPIError(w, r, errdefs.Errorf(errdefs.ErrInvalidArgument, "method %s is not allowed on /files (use GET or POST)", r.Method))
	}
}

// sendFile answers the content of file p, size bytes (-1: unknown) read
// from rc, which it closes.
func sendFile(w http.ResponseWriter, rc io.ReadCloser, size int64, p string) {
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// The status is sent: cut the response short so that the client
		// sees a failed transfer, not a shorter file.
		panic(http.ErrAbortHandler)
	}
}

// upload writes the files of a POST /files request.
func upload(r *http.Request, cl *agentclient.Client) ([]uploadEntry, error) {
	for k := range r.Header {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "X-Metadata-") {
			return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "file metadata (%s) is not supported by Corral: it keeps no metadata on files", k)
		}
	}
	q := r.URL.Query()
	user := q.Get("username")
	write := func(p string, body io.Reader) (uploadEntry, error) {
		p = resolvePath(p, user)
		fi, err := cl.WriteFile(r.Context(), p, 0o644, body)
		if err != nil {
			return uploadEntry{}, err
		}
		return uploadEntry{Path: fi.Path, Name: fi.Name, Type: "file"}, nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		if q.Get("path") == "" {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "the path query parameter is required for a raw upload")
		}
		var body io.Reader = r.Body
		switch enc := r.Header.Get("Content-Encoding"); enc {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading gzip upload: %v", err)
			}
			body = zr
		default:
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "upload encoding %q is not supported (use gzip or identity)", enc)
		}
		e, err := write(q.Get("path"), body)
		if err != nil {
			return nil, err
		}
		return []uploadEntry{e}, nil
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	out := []uploadEntry{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "reading multipart upload: %v", err)
		}
		if part.FormName() != "file" {
			continue
		}
		// Part.FileName keeps only the last element; the SDKs send the
		// whole destination path as the file name of each part.
		_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		target := q.Get("path")
		if target == "" {
			target = dp["filename"]
		} else if len(out) > 0 {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "several files uploaded to one path %q: name each by its part's file name instead", target)
		}
		if target == "" {
			return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "a file part has no path: set the path query parameter or the part's file name")
		}
		e, err := write(target, part)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, "the upload holds no \"file\" part")
	}
	return out, nil
}

// checkSignature verifies a signed file URL as the SDKs make them:
// "v1_" + unpadded base64(sha256("path:operation:user:token[:expiry]")).
func (s *Server) checkSignature(id, p, op, user, sig, exp string) error {
	raw := p + ":" + op + ":" + user + ":" + s.accessToken(id)
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return errdefs.Errorf(errdefs.ErrUnauthenticated, "invalid signature_expiration %q", exp)
		}
		if time.Now().Unix() > n {
			return errdefs.Errorf(errdefs.ErrUnauthenticated, "the signed URL expired")
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	if op == "" || subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return errdefs.Errorf(errdefs.ErrUnauthenticated, "invalid signature for %s of %q", op, p)
	}
	return nil
}
