// Package cluster registers a Corral node in etcd and reads the nodes
// registered there. A node's record lives under a lease that the node
// refreshes, so a node that stops (or loses etcd) leaves the list once its
// lease expires.
//
// It owns the node records and their leases only. It does not place
// sandboxes, forward requests or decide anything about a node's sandboxes:
// those belong to the daemon and the API, which read the records.
package cluster
