package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:         "/a/b",
		`/a\040b`:      "/a b",
		`/a\011b\134c`: "/a\tb\\c",
		`/a\04`:        `/a\04`,
		`/a\9999`:      `/a\9999`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnderFindsRoot(t *testing.T) {
	ms, err := Under("/")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range ms {
		found = found || m == "/"
	}
	if !found {
		t.Fatalf("Under(/) = %v, want / among them", ms)
	}
}
