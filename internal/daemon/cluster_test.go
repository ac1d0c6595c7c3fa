package daemon

import (
	"strings"
	"testing"
)

func TestClusterFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string // "" when accepted
	}{
		{"no cluster", nil, ""},
		{"all three", []string{"--cluster-etcd", "127.0.0.1:2379,http://h:2379", "--node-name", "n-1", "--advertise", "10.0.0.1:7000"}, ""},
		{"name without etcd", []string{"--node-name", "n-1"}, "need --cluster-etcd"},
		{"advertise without etcd", []string{"--advertise", "10.0.0.1:7000"}, "need --cluster-etcd"},
		{"no name", []string{"--cluster-etcd", "127.0.0.1:2379", "--advertise", "10.0.0.1:7000"}, "needs --node-name"},
		{"no advertise", []string{"--cluster-etcd", "127.0.0.1:2379", "--node-name", "n-1"}, "needs --advertise"},
		{"bad name", []string{"--cluster-etcd", "127.0.0.1:2379", "--node-name", "N_1", "--advertise", "10.0.0.1:7000"}, "--node-name"},
		{"advertise without port", []string{"--cluster-etcd", "127.0.0.1:2379", "--node-name", "n-1", "--advertise", "10.0.0.1"}, "--advertise"},
		{"advertise unspecified", []string{"--cluster-etcd", "127.0.0.1:2379", "--node-name", "n-1", "--advertise", "0.0.0.0:7000"}, "--advertise"},
		{"negative refresh", []string{"--cluster-etcd", "127.0.0.1:2379", "--node-name", "n-1", "--advertise", "h:7000", "--cluster-refresh", "-1s"}, "--cluster-refresh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, ok := parseFlags(tc.args)
			if !ok {
				t.Fatalf("parseFlags(%q) refused", tc.args)
			}
			err := cfg.checkCluster()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one with %q", err, tc.wantErr)
			}
		})
	}
	if _, ok := parseFlags([]string{"--cluster-etcd", "ftp://h:1"}); ok {
		t.Error("an ftp:// etcd endpoint was accepted")
	}
}
