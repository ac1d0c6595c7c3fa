package vmguest

import (
	"testing"
	"unsafe"
)

func TestParseNetwork(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"address and gateway", "10.200.0.2/30,10.200.0.1", true},
		{"with MTU", "10.200.0.2/30,10.200.0.1,1400", true},
		{"no prefix", "10.200.0.2,10.200.0.1", false},
		{"IPv6", "fd00::2/64,fd00::1", false},
		{"bad MTU", "10.200.0.2/30,10.200.0.1,9", false},
		{"one field", "10.200.0.2/30", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := ParseNetwork(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("ParseNetwork(%q) = %v, %v", tt.in, n, err)
			}
			if tt.ok && n.String() != tt.in {
				t.Errorf("String() = %q, want %q", n.String(), tt.in)
			}
		})
	}
}

// TestRtentrySize checks struct rtentry's layout on 64-bit Linux: 120
// bytes, the flags at offset 56 and the device name pointer at 88.
func TestRtentrySize(t *testing.T) {
	var rt rtentry
	if s, f, d := unsafe.Sizeof(rt), unsafe.Offsetof(rt.flags), unsafe.Offsetof(rt.dev); s != 120 || f != 56 || d != 88 {
		t.Errorf("size %d, flags at %d, dev at %d; want 120, 56, 88", s, f, d)
	}
}
