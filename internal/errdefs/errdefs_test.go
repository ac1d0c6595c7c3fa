package errdefs

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestCodeRoundTrip(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.code, func(t *testing.T) {
			wrapped := fmt.Errorf("doing a thing for sb-1: %w", k.err)
			if got := Code(wrapped); got != k.code {
				t.Fatalf("Code(%v) = %q, want %q", wrapped, got, k.code)
			}
			back := FromCode(k.code, "msg")
			if !errors.Is(back, k.err) {
				t.Fatalf("FromCode(%q) does not wrap %v", k.code, k.err)
			}
			if back.Error() != "msg" {
				t.Fatalf("message = %q", back.Error())
			}
		})
	}
}

func TestUnknownIsInternal(t *testing.T) {
	if got := Code(errors.New("plain")); got != CodeInternal {
		t.Fatalf("Code(plain) = %q", got)
	}
	if !errors.Is(FromCode("bogus", "x"), ErrInternal) {
		t.Fatal("unknown code should map to ErrInternal")
	}
	if !errors.Is(Errorf(ErrNotFound, "sandbox %s", "a"), ErrNotFound) {
		t.Fatal("Errorf lost its kind")
	}
}

func TestRetryAfterKeepsKind(t *testing.T) {
	err := fmt.Errorf("creating: %w", WithRetryAfter(Errorf(ErrBusy, "full"), 2*time.Second))
	if !errors.Is(err, ErrBusy) || Code(err) != CodeBusy {
		t.Fatalf("kind lost: %v (%s)", err, Code(err))
	}
	if got := RetryAfter(err); got != 2*time.Second {
		t.Fatalf("RetryAfter = %v", got)
	}
	if got := RetryAfter(Errorf(ErrBusy, "x")); got != 0 {
		t.Fatalf("RetryAfter without hint = %v", got)
	}
}
