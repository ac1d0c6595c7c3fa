package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/errdefs"
)

func TestValidID(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"a", true},
		{"k26kr6atgb5vrtkl", true},
		{"Sb-1_x", true},
		{strings.Repeat("x", MaxIDLength), true},
		{"", false},
		{".", false},
		{"..", false},
		{".spare-1", false},
		{"-a", false},
		{"_a", false},
		{"a.b", false},
		{"a+b", false},
		{"a/b", false},
		{"a b", false},
		{"é", false},
		{strings.Repeat("x", MaxIDLength+1), false},
	} {
		if got := ValidID(tt.id); got != tt.want {
			t.Errorf("ValidID(%q) = %v, want %v", tt.id, got, tt.want)
		}
		if err := CheckID(tt.id); (err == nil) != tt.want || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("CheckID(%q) = %v", tt.id, err)
		}
	}
}
