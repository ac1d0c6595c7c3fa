package cli

import (
	"bytes"
	"flag"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	corral "github.com/corralrun/corral/sdk"
)

func TestNetworkFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want *corral.NetworkPolicy
	}{
		{"none given", nil, nil},
		{"mode only", []string{"--network", "open"}, &corral.NetworkPolicy{Mode: "open"}},
		{"rules", []string{"--allow-domain", "a.test", "--allow-domain", "*.b.test:8443", "--allow-cidr", "10.0.0.0/8:443"},
			&corral.NetworkPolicy{AllowDomains: []string{"a.test", "*.b.test:8443"}, AllowCIDRs: []string{"10.0.0.0/8:443"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var f networkFlags
			f.register(fs, "network")
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, f.policy()); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPrintPolicy(t *testing.T) {
	var b bytes.Buffer
	printPolicy(&b, &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"a.test"}, AllowCIDRs: []string{"203.0.113.0/24"},
		Headers: []corral.HeaderRule{{Domain: "a.test", Name: "Authorization"}}})
	want := "mode: allowlist\nallow-domain: a.test\nallow-cidr: 203.0.113.0/24\nheader: a.test Authorization (value hidden)\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}
