package e2b

import (
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corralrun/corral/internal/errdefs"
)

// wireMsg has a field of every kind the codec carries.
type wireMsg struct {
	S    string            `pb:"1"`
	I32  int32             `pb:"2"`
	Z32  int32             `pb:"3,zigzag"`
	I64  int64             `pb:"4"`
	U32  uint32            `pb:"5"`
	B    bool              `pb:"6"`
	Raw  []byte            `pb:"7"`
	Opt  *string           `pb:"8"`
	Rep  []string          `pb:"9"`
	Map  map[string]string `pb:"10"`
	Sub  wireSub           `pb:"11"`
	SubP *wireSub          `pb:"12,oneof"`
	Subs []wireSub         `pb:"13"`
	One  []byte            `pb:"14,oneof"`
	Z64  int64             `pb:"15,zigzag"`
	U64  uint64            `pb:"16"`
	skip int
}

type wireSub struct {
	N uint32 `pb:"1"`
	S string `pb:"2"`
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func ptr[T any](v T) *T { return &v }

func TestParseProto(t *testing.T) {
	tests := []struct {
		name string
		wire string // hex, spaces ignored
		want wireMsg
		err  string // a part of the error; "" for success
	}{
		{name: "empty message", wire: ""},
		{name: "string", wire: "0a 02 6869", want: wireMsg{S: "hi"}},
		{name: "last scalar wins", wire: "0a 01 61 0a 01 62", want: wireMsg{S: "b"}},
		{name: "negative int32 in ten bytes", wire: "10 ffffffffffffffffff01", want: wireMsg{I32: -1}},
		{name: "sint32", wire: "18 03", want: wireMsg{Z32: -2}},
		{name: "sint32 keeps the low 32 bits", wire: "18 8480808010", want: wireMsg{Z32: 2}},
		{name: "sint64", wire: "78 ffffffffffffffffff01", want: wireMsg{Z64: -9223372036854775808}},
		{name: "int64", wire: "20 8001", want: wireMsg{I64: 128}},
		{name: "uint32 keeps the low 32 bits", wire: "28 8580808010", want: wireMsg{U32: 5}},
		{name: "uint64", wire: "8001 ffffffffffffffffff01", want: wireMsg{U64: 1<<64 - 1}},
		{name: "bool", wire: "30 01", want: wireMsg{B: true}},
		{name: "bool from any non-zero varint", wire: "30 02", want: wireMsg{B: true}},
		{name: "bytes", wire: "3a 03 000102", want: wireMsg{Raw: []byte{0, 1, 2}}},
		{name: "optional empty string is present", wire: "42 00", want: wireMsg{Opt: ptr("")}},
		{name: "repeated string keeps empty elements", wire: "4a 01 61 4a 00", want: wireMsg{Rep: []string{"a", ""}}},
		{name: "map entries", wire: "52 06 0a016b 120176 52 03 0a0178", want: wireMsg{Map: map[string]string{"k": "v", "x": ""}}},
		{name: "map entry seen twice keeps the last", wire: "52 06 0a016b 120176 52 06 0a016b 120177", want: wireMsg{Map: map[string]string{"k": "w"}}},
		{name: "embedded message", wire: "5a 02 0807", want: wireMsg{Sub: wireSub{N: 7}}},
		{name: "embedded message seen twice is merged", wire: "5a 02 0807 5a 03 120178", want: wireMsg{Sub: wireSub{N: 7, S: "x"}}},
		{name: "empty oneof message is present", wire: "62 00", want: wireMsg{SubP: &wireSub{}}},
		{name: "oneof message seen twice is merged", wire: "62 02 0807 62 03 120178", want: wireMsg{SubP: &wireSub{N: 7, S: "x"}}},
		{name: "repeated messages", wire: "6a 02 0801 6a 00", want: wireMsg{Subs: []wireSub{{N: 1}, {}}}},
		{name: "empty oneof bytes are present", wire: "72 00", want: wireMsg{One: []byte{}}},
		{name: "last oneof member wins", wire: "62 02 0807 72 01 61", want: wireMsg{One: []byte("a")}},
		{name: "last oneof member wins, other order", wire: "72 01 61 62 02 0807", want: wireMsg{SubP: &wireSub{N: 7}}},
		{
			// A varint (field 99), fixed32 (20), fixed64 (21), bytes (22)
			// and a group (23) holding a varint.
			name: "unknown fields are skipped",
			wire: "9806 05  a501 01020304  a901 0102030405060708  b201 01ff  bb01 0801 bc01  0a 01 61",
			want: wireMsg{S: "a"},
		},
		{name: "truncated tag", wire: "80", err: "field tag: unexpected EOF"},
		{name: "field number 0", wire: "00 01", err: "field tag: proto: invalid field number"},
		{name: "truncated varint", wire: "10 ff", err: "field 2: unexpected EOF"},
		{name: "varint longer than ten bytes", wire: "10 ffffffffffffffffffff01", err: "field 2: proto: variable length integer overflow"},
		{name: "truncated length", wire: "0a 05 61", err: "field 1: unexpected EOF"},
		{name: "missing length", wire: "0a", err: "field 1: unexpected EOF"},
		// A known field in another wire type is skipped as unknown.
		{name: "string sent as varint", wire: "08 01  10 01", want: wireMsg{I32: 1}},
		{name: "int sent as bytes", wire: "12 00  0a 01 61", want: wireMsg{S: "a"}},
		{name: "message sent as fixed32", wire: "5d 00000000", want: wireMsg{}},
		{name: "optional sent as varint stays absent", wire: "40 01", want: wireMsg{}},
		{name: "repeated element with wrong wire type", wire: "48 01  4a 01 61", want: wireMsg{Rep: []string{"a"}}},
		{name: "map entry key with wrong wire type", wire: "52 05 0801 1201 76", want: wireMsg{Map: map[string]string{"": "v"}}},
		{name: "wrong wire type, then truncated", wire: "08 ff", err: "field 1: unexpected EOF"},
		{name: "error in an embedded message", wire: "5a 02 1205", err: "field 11: field 2: unexpected EOF"},
		{name: "error in a map entry", wire: "52 02 0a05", err: "field 10: field 1: unexpected EOF"},
		{name: "truncated unknown field", wire: "9806", err: "field 99: unexpected EOF"},
		{name: "unknown group without its end", wire: "bb01 0801", err: "field 23: unexpected EOF"},
		{name: "end group without a start", wire: "bc01", err: "field 23:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got wireMsg
			err := parseProto(unhex(t, tt.wire), &got)
			if tt.err != "" {
				// protobuf's own messages put a no-break space after "proto:" at random.
				if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), "\u00a0", " "), tt.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("error %v, want an invalid argument error with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(wireMsg{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendProto(t *testing.T) {
	tests := []struct {
		name string
		msg  any
		want string // hex, spaces ignored
	}{
		// An embedded message is always written; scalars at their zero
		// value are not.
		{name: "zero message", msg: wireMsg{}, want: "5a 00"},
		{name: "pointer to a message", msg: &wireSub{N: 1}, want: "08 01"},
		{name: "empty message type", msg: empty{}, want: ""},
		{name: "scalars", msg: wireSub{N: 300, S: "hi"}, want: "08 ac02 12 02 6869"},
		{
			name: "negative int32 in ten bytes, sint32, int64, uint64, bool",
			msg:  wireMsg{I32: -1, Z32: -2, I64: 128, U64: 1<<64 - 1, B: true},
			want: "10 ffffffffffffffffff01 18 03 20 8001 30 01 5a 00 8001 ffffffffffffffffff01",
		},
		{name: "sint64", msg: wireMsg{Z64: -9223372036854775808}, want: "5a 00 78 ffffffffffffffffff01"},
		{name: "empty bytes are left out", msg: wireMsg{Raw: []byte{}}, want: "5a 00"},
		{name: "empty oneof bytes are written", msg: wireMsg{One: []byte{}}, want: "5a 00 72 00"},
		{name: "nil oneof bytes are left out", msg: wireMsg{One: nil}, want: "5a 00"},
		{name: "optional empty string is written", msg: wireMsg{Opt: ptr("")}, want: "42 00 5a 00"},
		{name: "repeated string writes empty elements", msg: wireMsg{Rep: []string{"a", ""}}, want: "4a 01 61 4a 00 5a 00"},
		{name: "map in key order, empty value left out", msg: wireMsg{Map: map[string]string{"x": "", "k": "v"}}, want: "52 06 0a016b 120176 52 03 0a0178 5a 00"},
		{name: "oneof message", msg: wireMsg{SubP: &wireSub{}}, want: "5a 00 62 00"},
		{name: "repeated messages", msg: wireMsg{Subs: []wireSub{{N: 1}, {}}}, want: "5a 00 6a 02 0801 6a 00"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := hex.EncodeToString(appendProto(nil, tt.msg)); got != strings.ReplaceAll(tt.want, " ", "") {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
	if got := appendProto([]byte{0xff}, wireSub{N: 1}); hex.EncodeToString(got) != "ff0801" {
		t.Errorf("appendProto does not append: %x", got)
	}
}

// fill sets every field of v, recursively, to a value that is not the
// zero value, but only the last member of a oneof, as a valid message has
// one; n makes the values differ.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Struct:
		lastOneof := -1
		for _, f := range pbFields(v.Type()) {
			if f.oneof {
				lastOneof = max(lastOneof, f.index)
			}
		}
		oneof := map[int]bool{}
		for _, f := range pbFields(v.Type()) {
			oneof[f.index] = f.oneof
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() && (!oneof[i] || i == lastOneof) {
				fill(v.Field(i), n)
			}
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), n)
		fill(v.Index(1), n)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(reflect.ValueOf(fmt.Sprint("k", *n)), reflect.ValueOf(fmt.Sprint("v", *n)))
	case reflect.String:
		v.SetString(fmt.Sprint("s", *n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int32, reflect.Int64:
		v.SetInt(int64(-*n))
	case reflect.Uint8, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	}
}

// TestMessagesRoundTrip encodes every message type of the package with
// all its fields set and decodes it again: their tags are valid, and
// every field survives.
func TestMessagesRoundTrip(t *testing.T) {
	for _, m := range []any{
		empty{}, processSelector{}, processConfig{}, ptyConfig{}, startRequest{}, selectorRequest{}, updateRequest{},
		processInput{}, sendInputRequest{}, streamInputRequest{}, sendSignalRequest{}, processInfo{}, listResponse{},
		processEvent{}, dataEvent{}, endEvent{}, processEventResponse{}, pathRequest{}, moveRequest{}, listDirRequest{},
		watchRequest{}, watcherRequest{}, timestamp{}, entryInfo{}, entryResponse{}, listDirResponse{}, fsEvent{},
		watchDirResponse{}, createWatcherResponse{}, watcherEventsResponse{},
	} {
		typ := reflect.TypeOf(m)
		t.Run(typ.Name(), func(t *testing.T) {
			in := reflect.New(typ)
			fill(in.Elem(), new(int))
			out := reflect.New(typ)
			if err := parseProto(appendProto(nil, in.Interface()), out.Interface()); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(in.Interface(), out.Interface()); diff != "" {
				t.Errorf("(-sent +decoded):\n%s", diff)
			}
		})
	}
}

func TestBadTagsPanic(t *testing.T) {
	tests := []struct {
		name string
		msg  any
		want string
	}{
		{"no tag", struct{ A string }{}, "no pb tag"},
		{"field number 0", struct {
			A string `pb:"0"`
		}{}, `invalid field number "0"`},
		{"field number not a number", struct {
			A string `pb:"one"`
		}{}, `invalid field number "one"`},
		{"reserved field number", struct {
			A string `pb:"19000"`
		}{}, `invalid field number "19000"`},
		{"number used twice", struct {
			A string `pb:"1"`
			B string `pb:"1"`
		}{}, "field number 1 is used twice"},
		{"unknown option", struct {
			A string `pb:"1,packed"`
		}{}, `unknown pb option "packed"`},
		{"int", struct {
			A int `pb:"1"`
		}{}, "type int is not supported"},
		{"repeated int32", struct {
			A []int32 `pb:"1"`
		}{}, "repeated int32 is not supported"},
		{"map to int", struct {
			A map[string]int32 `pb:"1"`
		}{}, "map[string]int32 is not supported"},
		{"pointer to pointer", struct {
			A **string `pb:"1"`
		}{}, "type **string is not supported"},
		{"oneof on a plain string", struct {
			A string `pb:"1,oneof"`
		}{}, "oneof member of type string"},
		{"zigzag on uint32", struct {
			A uint32 `pb:"1,zigzag"`
		}{}, "zigzag on type uint32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, tt.want) {
					t.Errorf("panic %v, want one with %q", r, tt.want)
				}
			}()
			appendProto(nil, tt.msg)
		})
	}
}

// BenchmarkAppendProto encodes the message a process's output is streamed
// in, the hottest one.
func BenchmarkAppendProto(b *testing.B) {
	m := processEventResponse{Event: processEvent{Data: &dataEvent{Stdout: make([]byte, 512)}}}
	var buf []byte
	for b.Loop() {
		buf = appendProto(buf[:0], m)
	}
}

// BenchmarkParseProto decodes a StartRequest as E2B's SDKs send it.
func BenchmarkParseProto(b *testing.B) {
	tag := "t"
	data := appendProto(nil, startRequest{Process: processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"},
		Envs: map[string]string{"A": "1"}}, PTY: &ptyConfig{Size: &ptySize{Cols: 80, Rows: 24}}, Tag: &tag})
	for b.Loop() {
		var req startRequest
		if err := parseProto(data, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendProtoListDir encodes a directory listing of 10,000
// entries, where a type's tags are read once per call, not per entry.
func BenchmarkAppendProtoListDir(b *testing.B) {
	var list listDirResponse
	for i := range 10000 {
		list.Entries = append(list.Entries, entryInfo{Name: "file" + strconv.Itoa(i), Type: fileTypeFile, Path: "/work/file" + strconv.Itoa(i),
			Size: int64(i), Mode: 0o644, Permissions: "-rw-r--r--", Owner: "root", Group: "root", ModifiedTime: &timestamp{Seconds: 1700000000}})
	}
	var buf []byte
	for b.Loop() {
		buf = appendProto(buf[:0], list)
	}
}
