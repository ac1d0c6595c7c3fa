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
		{"headers", []string{"--inject-header", "api.test:Authorization=Bearer {{secret:openai}}", "--inject-header", "*.b.test:X-A=k=v:w"},
			&corral.NetworkPolicy{Headers: []corral.HeaderRule{{Domain: "api.test", Name: "Authorization", Value: "Bearer {{secret:openai}}"},
				{Domain: "*.b.test", Name: "X-A", Value: "k=v:w"}}}},
		{"placeholders", []string{"--placeholder", "OPENAI_API_KEY=openai@api.openai.com", "--placeholder", "TOKEN=gh@*.github.test,body"},
			&corral.NetworkPolicy{Placeholders: []corral.PlaceholderRule{{Domain: "api.openai.com", Env: "OPENAI_API_KEY", Secret: "openai"},
				{Domain: "*.github.test", Env: "TOKEN", Secret: "gh", Body: true}}}},
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
			got, err := f.policy()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("policy (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNetworkFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--inject-header", "api.test"},
		{"--inject-header", "api.test:Authorization"},
		{"--inject-header", ":X=v"},
		{"--inject-header", "api.test:=v"},
		{"--inject-header", "api.test:X="},
		{"--placeholder", "KEY=secret"},
		{"--placeholder", "=secret@a.test"},
		{"--placeholder", "KEY=@a.test"},
		{"--placeholder", "KEY=s@"},
		{"--placeholder", "KEY=s@a.test,headers"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f networkFlags
		f.register(fs, "network")
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if p, err := f.policy(); err == nil {
			t.Errorf("%q: %+v, want an error", args, p)
		}
	}
}

func TestKeepRules(t *testing.T) {
	cur := &corral.NetworkPolicy{
		Headers:      []corral.HeaderRule{{Domain: "a.test", Name: "Authorization"}, {Domain: "b.test", Name: "X-Key"}},
		Placeholders: []corral.PlaceholderRule{{Domain: "a.test", Env: "A", Secret: "a"}, {Domain: "b.test", Env: "B", Secret: "b", Body: true}},
	}
	p := &corral.NetworkPolicy{
		Headers:      []corral.HeaderRule{{Domain: "a.test", Name: "authorization", Value: "Bearer {{secret:new}}"}},
		Placeholders: []corral.PlaceholderRule{{Domain: "c.test", Env: "B", Secret: "c"}},
	}
	keepRules(p, cur)
	want := &corral.NetworkPolicy{
		Headers:      []corral.HeaderRule{{Domain: "a.test", Name: "authorization", Value: "Bearer {{secret:new}}"}, {Domain: "b.test", Name: "X-Key"}},
		Placeholders: []corral.PlaceholderRule{{Domain: "c.test", Env: "B", Secret: "c"}, {Domain: "a.test", Env: "A", Secret: "a"}},
	}
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("policy (-want +got):\n%s", diff)
	}
	keepRules(p, nil)
	if diff := cmp.Diff(want, p); diff != "" {
		t.Errorf("policy after keeping a nil policy (-want +got):\n%s", diff)
	}
}

func TestPrintPolicy(t *testing.T) {
	var b bytes.Buffer
	printPolicy(&b, &corral.NetworkPolicy{Mode: "allowlist", AllowDomains: []string{"a.test"}, AllowCIDRs: []string{"203.0.113.0/24"},
		Headers:      []corral.HeaderRule{{Domain: "a.test", Name: "Authorization"}},
		Placeholders: []corral.PlaceholderRule{{Domain: "a.test", Env: "KEY", Secret: "k", Body: true}}})
	want := "mode: allowlist\nallow-domain: a.test\nallow-cidr: 203.0.113.0/24\nheader: a.test Authorization (value hidden)\n" +
		"placeholder: KEY=k@a.test,body\n"
	if b.String() != want {
		t.Errorf("printed %q, want %q", b.String(), want)
	}
}
