package egress

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestReplacer(t *testing.T) {
	reps := []replacement{{old: "corral-placeholder-aa", new: "SECRET"}, {old: "corral-placeholder-b", new: ""}}
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"none", "hello world", "hello world"},
		{"whole", "corral-placeholder-aa", "SECRET"},
		{"edges", "corral-placeholder-aa mid corral-placeholder-aa", "SECRET mid SECRET"},
		{"adjacent", "corral-placeholder-aacorral-placeholder-bcorral-placeholder-aa", "SECRETSECRET"},
		{"prefix only", "corral-placeholder-a", "corral-placeholder-a"},
		{"prefix then match", "corral-placeholdercorral-placeholder-aa", "corral-placeholderSECRET"},
		{"long input", strings.Repeat("x", 3*replaceChunk) + "corral-placeholder-aa" + strings.Repeat("y", replaceChunk-3), strings.Repeat("x", 3*replaceChunk) + "SECRET" + strings.Repeat("y", replaceChunk-3)},
	}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":     func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
		"data+EOF": func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
	}
	for _, tt := range tests {
		for rname, mk := range readers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				got, err := io.ReadAll(newReplacer(mk(tt.in), reps))
				if err != nil || string(got) != tt.want {
					t.Errorf("got %d bytes %.60q, %v; want %d bytes %.60q", len(got), got, err, len(tt.want), tt.want)
				}
			})
		}
	}
	t.Run("read error passes through", func(t *testing.T) {
		r := newReplacer(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(io.ErrUnexpectedEOF)), reps)
		got, err := io.ReadAll(r)
		if err != io.ErrUnexpectedEOF || !bytes.Equal(got, []byte("abc")) {
			t.Errorf("got %q, %v", got, err)
		}
	})
}
