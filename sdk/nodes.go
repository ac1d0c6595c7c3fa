package corral

import (
	"context"
	"time"
)

// Node is a node of the cluster the daemon is in, as the node last
// registered itself.
type Node struct {
	Name string `json:"name"`
	// Advertise is the HOST:PORT at which the other nodes reach its API.
	Advertise string `json:"advertise"`
	// Runtimes and Templates are those the node offers and holds.
	Runtimes  []string     `json:"runtimes"`
	Templates []string     `json:"templates"`
	Capacity  NodeCapacity `json:"capacity"`
	Load      NodeLoad     `json:"load"`
	// UpdatedAt is when the node last wrote its record (every few
	// seconds while it runs).
	UpdatedAt time.Time `json:"updated_at"`
}

// NodeCapacity is a node's host: its CPUs, in thousandths, and memory.
type NodeCapacity struct {
	MilliCPUs   int64 `json:"millicpus"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// NodeLoad is what a node's sandboxes hold: those that exist or are
// being created (warm pool members included), those running, and the CPU
// and memory limits they reserve.
type NodeLoad struct {
	Sandboxes           int   `json:"sandboxes"`
	Running             int   `json:"running"`
	ReservedMilliCPUs   int64 `json:"reserved_millicpus"`
	ReservedMemoryBytes int64 `json:"reserved_memory_bytes"`
}

// Nodes lists the live nodes of the cluster the daemon is in, sorted by
// name (GET /v1/nodes, admin keys only). A daemon outside a cluster
// answers an error of code CodeFailedPrecondition.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	var out []Node
	if err := c.doJSON(ctx, "GET", "/v1/nodes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}
