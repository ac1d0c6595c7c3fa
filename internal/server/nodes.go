package server

import (
	"context"
	"net/http"

	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/errdefs"
)

// NodeLister lists the live nodes of the cluster the daemon is in
// (*cluster.Cluster).
type NodeLister interface {
	List(ctx context.Context) ([]cluster.Node, error)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Nodes == nil {
		s.writeError(w, r, errdefs.Errorf(errdefs.ErrFailedPrecondition,
			"this daemon is not in a cluster: start it with --cluster-etcd, --node-name and --advertise"))
		return
	}
	nodes, err := s.cfg.Nodes.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, nodes)
}
