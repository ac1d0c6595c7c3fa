package server

import (
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/secrets"
	"github.com/corralrun/corral/internal/tenancy"
)

// SecretRequest is the body of POST /v1/secrets.
type SecretRequest struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// RotateSecretRequest is the body of PUT /v1/secrets/{name}.
type RotateSecretRequest struct {
	Value string `json:"value"`
}

// SecretView is a secret as the API shows it: never its value, which no
// route returns.
type SecretView struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func secretView(i secrets.Info) SecretView {
	return SecretView{Name: i.Name, CreatedAt: i.CreatedAt, UpdatedAt: i.UpdatedAt}
}

// secretRoutes are open to every key: a key manages the secrets of the
// tenant it acts for (an admin's, that of its X-Corral-Tenant header), and
// only those.
func (s *Server) secretRoutes() []route {
	return []route{
		{"GET /v1/secrets", s.listSecrets},
		{"POST /v1/secrets", s.createSecret},
		{"PUT /v1/secrets/{name}", s.rotateSecret},
		{"DELETE /v1/secrets/{name}", s.deleteSecret},
	}
}

// secretStore is the secret store, or an error saying the server has
// none.
func (s *Server) secretStore() (*secrets.Store, error) {
	if s.cfg.Secrets == nil {
		return nil, errdefs.Errorf(errdefs.ErrNotImplemented, "this server keeps no secrets")
	}
	return s.cfg.Secrets, nil
}

// maxSecretBody leaves room for a value of secrets.MaxValueSize bytes
// each escaped as \u00XX.
const maxSecretBody = 6*secrets.MaxValueSize + 4096

// decodeSecret reads the body of a secret request into v, which want
// describes. Its errors never quote the body, as decode's JSON errors
// may: the body holds the value.
func decodeSecret(r *http.Request, v any, want string) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxSecretBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON body: want %s (the body is not quoted: it holds a secret)", want)
	}
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	st, err := s.secretStore()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := st.List(r.Context(), tenancy.Owner(r.Context()))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, views(list, secretView))
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	st, err := s.secretStore()
	var req SecretRequest
	if err == nil {
		err = decodeSecret(r, &req, `{"name": NAME, "value": VALUE}`)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	i, err := st.Create(r.Context(), tenancy.Owner(r.Context()), req.Name, req.Value)
	s.answerSecret(w, r, http.StatusCreated, i, err)
}

func (s *Server) rotateSecret(w http.ResponseWriter, r *http.Request) {
	st, err := s.secretStore()
	var req RotateSecretRequest
	if err == nil {
		err = decodeSecret(r, &req, `{"value": VALUE}`)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	i, err := st.Rotate(r.Context(), tenancy.Owner(r.Context()), r.PathValue("name"), req.Value)
	s.answerSecret(w, r, http.StatusOK, i, err)
}

// answerSecret answers with the secret i and status, or with err.
func (s *Server) answerSecret(w http.ResponseWriter, r *http.Request, status int, i secrets.Info, err error) {
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, secretView(i))
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	st, err := s.secretStore()
	if err == nil {
		err = st.Delete(r.Context(), tenancy.Owner(r.Context()), r.PathValue("name"))
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
