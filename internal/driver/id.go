package driver

import "github.com/corralrun/corral/internal/errdefs"

// MaxIDLength bounds a sandbox ID (ValidID).
const MaxIDLength = 64

// ValidID reports whether id can name a sandbox to the packages that
// turn it into host names: 1 to MaxIDLength ASCII letters, digits, '_'
// or '-', starting with a letter or a digit. Such an ID is safe as a file
// name (never "." or ".."), as a runtime's container ID, as part of an
// nftables chain name and as an interface alias. Every ID the Manager
// makes passes.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLength || !isAlnum(id[0]) {
		return false
	}
	for i := 1; i < len(id); i++ {
		if c := id[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// CheckID returns an error wrapping errdefs.ErrInvalidArgument unless
// ValidID(id).
func CheckID(id string) error {
	if !ValidID(id) {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid sandbox id %q: want 1-%d letters, digits, '_' or '-', starting with a letter or digit", id, MaxIDLength)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
