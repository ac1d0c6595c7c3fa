package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/corralrun/corral/internal/errdefs"
)

// Prefix holds one key per registered node: Prefix + name.
const Prefix = "/corral/nodes/"

// Node is a node's record in etcd, as it last wrote it.
type Node struct {
	Name string `json:"name"`
	// Advertise is the host:port at which other nodes reach this node's API.
	Advertise string `json:"advertise"`
	// Runtimes and Templates are the names of the runtimes the node
	// offers and of the templates it holds, sorted.
	Runtimes  []string  `json:"runtimes"`
	Templates []string  `json:"templates"`
	Capacity  Capacity  `json:"capacity"`
	Load      Load      `json:"load"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Capacity is what a node's host has for sandboxes.
type Capacity struct {
	MilliCPUs   int64 `json:"millicpus"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// Load is what a node's sandboxes hold of its capacity.
type Load struct {
	// Sandboxes exist or are being created (warm pool members included);
	// Running of them are running.
	Sandboxes int `json:"sandboxes"`
	Running   int `json:"running"`
	// MilliCPUs and MemoryBytes are the limits those sandboxes reserve.
	MilliCPUs   int64 `json:"reserved_millicpus"`
	MemoryBytes int64 `json:"reserved_memory_bytes"`
}

// nameRE is a DNS label: node names appear in keys, logs and host names.
var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckName returns an error unless name is a valid node name: 1 to 63
// lowercase letters, digits and inner hyphens.
func CheckName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("node name %q: want 1 to 63 lowercase letters, digits and hyphens, starting and ending with a letter or digit", name)
	}
	return nil
}

// CheckAdvertise returns an error unless addr is a host:port other nodes
// can dial: a host name or a specified IP address, and a port 1-65535.
func CheckAdvertise(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("advertise address %q: want HOST:PORT: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("advertise address %q: no host", addr)
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return fmt.Errorf("advertise address %q: %s is not an address other nodes can reach", addr, host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("advertise address %q: port must be 1-65535", addr)
	}
	return nil
}

// ParseEndpoints splits a comma-separated list of etcd endpoints
// (host:port or http(s)://host:port) and checks each.
func ParseEndpoints(s string) ([]string, error) {
	var out []string
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		hostport := e
		if rest, ok := strings.CutPrefix(e, "http://"); ok {
			hostport = rest
		} else if rest, ok := strings.CutPrefix(e, "https://"); ok {
			hostport = rest
		} else if strings.Contains(e, "://") {
			return nil, fmt.Errorf("etcd endpoint %q: want HOST:PORT, http://HOST:PORT or https://HOST:PORT", e)
		}
		if _, port, err := net.SplitHostPort(hostport); err != nil || port == "" {
			return nil, fmt.Errorf("etcd endpoint %q: want HOST:PORT, http://HOST:PORT or https://HOST:PORT", e)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, errors.New("no etcd endpoint given")
	}
	return out, nil
}

// Cluster is a connection to the etcd that holds the node records. It is
// safe for concurrent use.
type Cluster struct {
	cli *clientv3.Client
	log *slog.Logger
}

// Dial connects to etcd at endpoints and checks, within timeout, that it
// answers, so that a wrong endpoint fails at once rather than at the
// first registration.
func Dial(ctx context.Context, endpoints []string, timeout time.Duration, log *slog.Logger) (*Cluster, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: timeout,
		Logger:      zapDiscard(),
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd at %s: %w", strings.Join(endpoints, ","), err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(ctx, Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("reaching etcd at %s: %w", strings.Join(endpoints, ","), err)
	}
	return &Cluster{cli: cli, log: log}, nil
}

// Close ends the connection. Members registered through it must be
// stopped first.
func (c *Cluster) Close() error { return c.cli.Close() }

// List returns the live nodes' records, sorted by name: those whose lease
// has not expired. It fails with errdefs.ErrUnavailable when etcd does
// not answer.
func (c *Cluster) List(ctx context.Context) ([]Node, error) {
	resp, err := c.cli.Get(ctx, Prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, errdefs.Errorf(errdefs.ErrUnavailable, "listing nodes in etcd: %v", err)
	}
	out := make([]Node, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var n Node
		if err := json.Unmarshal(kv.Value, &n); err != nil {
			return nil, fmt.Errorf("decoding node record %s: %w", kv.Key, err)
		}
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Event is a change of one node's record: Node is its new record, or nil
// when the record is gone (the node stopped, or its lease expired).
type Event struct {
	Name string
	Node *Node
}

// Watch delivers the changes of node records made after it is called,
// in order, until ctx ends or the watch fails; then it closes the
// channel. A caller that needs the whole set lists the nodes after
// starting the watch, and again after the channel closes early.
func (c *Cluster) Watch(ctx context.Context) <-chan Event {
	out := make(chan Event)
	wch := c.cli.Watch(clientv3.WithRequireLeader(ctx), Prefix, clientv3.WithPrefix())
	go func() {
		defer close(out)
		for resp := range wch {
			if err := resp.Err(); err != nil {
				c.log.Warn("watching cluster nodes", "err", err)
				return
			}
			for _, ev := range resp.Events {
				e := Event{Name: strings.TrimPrefix(string(ev.Kv.Key), Prefix)}
				if ev.Type == clientv3.EventTypePut {
					var n Node
					if err := json.Unmarshal(ev.Kv.Value, &n); err != nil {
						c.log.Warn("decoding node record", "key", string(ev.Kv.Key), "err", err)
						continue
					}
					e.Node = &n
				}
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
