package e2b

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/corralrun/corral/internal/e2b/envdpb"
	"github.com/corralrun/corral/internal/errdefs"
)

// TestProtoCodecErrors checks that a malformed binary message is an
// invalid_argument error naming the path of fields to the fault.
func TestProtoCodecErrors(t *testing.T) {
	tests := []struct {
		name string
		wire string // hex, spaces ignored
		err  string // a part of the error; "" for success
	}{
		{name: "empty message", wire: ""},
		{name: "unknown fields are skipped", wire: "9806 05  a501 01020304  bb01 0801 bc01  1a 01 61"},
		{name: "known field in another wire type is skipped", wire: "08 01  1a 01 61"},
		{name: "truncated tag", wire: "80", err: "field tag: unexpected EOF"},
		{name: "field number 0", wire: "00 01", err: "field tag: proto: invalid field number"},
		{name: "truncated length", wire: "0a 05 61", err: "field 1: unexpected EOF"},
		{name: "overlong varint", wire: "48 ffffffffffffffffffff01", err: "field 9: proto: variable length integer overflow"},
		{name: "error in an embedded message", wire: "12 02 1205", err: "field 2: field 2: unexpected EOF"},
		{name: "error in a map entry", wire: "0a 04 1a02 0a05", err: "field 1: field 3: field 1: unexpected EOF"},
		{name: "unknown group without its end", wire: "bb01 0801", err: "field 23: unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var msg envdpb.StartRequest
			err := protoCodec{}.Unmarshal(unhex(t, tt.wire), &msg)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			// protobuf's own messages put a no-break space after "proto:" at random.
			if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "\u00a0", " "), tt.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v, want an invalid argument error with %q", err, tt.err)
			}
		})
	}
}

func TestConnectError(t *testing.T) {
	tests := []struct {
		err  error
		want connect.Code
	}{
		{errdefs.Errorf(errdefs.ErrNotFound, "x"), connect.CodeNotFound},
		{errdefs.Errorf(errdefs.ErrNotImplemented, "x"), connect.CodeUnimplemented},
		{errdefs.Errorf(errdefs.ErrUnavailable, "x"), connect.CodeUnavailable},
		{errdefs.Errorf(errdefs.ErrBusy, "x"), connect.CodeUnknown},
		{errdefs.Errorf(errdefs.ErrInternal, "x"), connect.CodeInternal},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), connect.CodeDeadlineExceeded},
		{context.Canceled, connect.CodeCanceled},
	}
	for _, tt := range tests {
		ce := connectError(tt.err)
		if ce.Code() != tt.want || ce.Message() != tt.err.Error() {
			t.Errorf("connectError(%v) = %v %q, want %v", tt.err, ce.Code(), ce.Message(), tt.want)
		}
	}
}
