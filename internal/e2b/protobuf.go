package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/corralrun/corral/internal/errdefs"
)

// The envd messages are encoded by hand: there are few of them, they are
// small, and generated code would bring a code generator into the build.
// Binary encoding follows the protobuf wire format; JSON follows the
// canonical proto3 JSON mapping (lowerCamelCase names, int64 as strings,
// bytes as base64, enums by name, defaults omitted). Field numbers and
// types are those of E2B's process.proto and filesystem.proto.

// pbEnc appends fields in the protobuf wire format. Zero values are
// skipped, as proto3 does, except where a method says otherwise.
type pbEnc []byte

func (e *pbEnc) tag(num protowire.Number, typ protowire.Type) {
	*e = protowire.AppendTag(*e, num, typ)
}

func (e *pbEnc) str(num protowire.Number, s string) {
	if s != "" {
		e.tag(num, protowire.BytesType)
		*e = protowire.AppendString(*e, s)
	}
}

// strAlways writes a string even when empty (a repeated element).
func (e *pbEnc) strAlways(num protowire.Number, s string) {
	e.tag(num, protowire.BytesType)
	*e = protowire.AppendString(*e, s)
}

// optStr writes a proto3 optional string: present when non-nil, even empty.
func (e *pbEnc) optStr(num protowire.Number, s *string) {
	if s != nil {
		e.tag(num, protowire.BytesType)
		*e = protowire.AppendString(*e, *s)
	}
}

// bytesAlways writes a bytes field even when empty: a oneof member is
// present whenever it is set.
func (e *pbEnc) bytesAlways(num protowire.Number, b []byte) {
	e.tag(num, protowire.BytesType)
	*e = protowire.AppendBytes(*e, b)
}

func (e *pbEnc) uvarint(num protowire.Number, v uint64) {
	if v != 0 {
		e.tag(num, protowire.VarintType)
		*e = protowire.AppendVarint(*e, v)
	}
}

func (e *pbEnc) sint32(num protowire.Number, v int32) {
	if v != 0 {
		e.tag(num, protowire.VarintType)
		*e = protowire.AppendVarint(*e, protowire.EncodeZigZag(int64(v)))
	}
}

func (e *pbEnc) int64(num protowire.Number, v int64) {
	if v != 0 {
		e.tag(num, protowire.VarintType)
		*e = protowire.AppendVarint(*e, uint64(v))
	}
}

func (e *pbEnc) bool(num protowire.Number, v bool) {
	if v {
		e.tag(num, protowire.VarintType)
		*e = protowire.AppendVarint(*e, 1)
	}
}

// msg writes an embedded message; it is always present (an empty oneof
// member such as a keepalive must still be sent).
func (e *pbEnc) msg(num protowire.Number, m response) {
	e.tag(num, protowire.BytesType)
	*e = protowire.AppendBytes(*e, m.appendProto(nil))
}

// stringMap writes a map<string, string> as its repeated entry messages.
func (e *pbEnc) stringMap(num protowire.Number, m map[string]string) {
	for k, v := range m {
		var entry pbEnc
		entry.str(1, k)
		entry.str(2, v)
		e.tag(num, protowire.BytesType)
		*e = protowire.AppendBytes(*e, entry)
	}
}

// pbField is one decoded field: v for varints, b for length-delimited ones.
type pbField struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
}

// parseFields calls fn for each field of a binary message in order.
func parseFields(b []byte, fn func(f pbField) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid protobuf message: %v", protowire.ParseError(n))
		}
		b = b[n:]
		f := pbField{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid protobuf field %d: %v", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// parseMsg decodes an embedded message field into m.
func parseMsg(f pbField, m request) error {
	if f.typ != protowire.BytesType {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid protobuf field %d: want a message", f.num)
	}
	return m.parseProto(f.b)
}

// parseStringMapEntry decodes one entry of a map<string, string>.
func parseStringMapEntry(f pbField, m map[string]string) error {
	var k, v string
	err := parseFields(f.b, func(e pbField) error {
		switch e.num {
		case 1:
			k = string(e.b)
		case 2:
			v = string(e.b)
		}
		return nil
	})
	m[k] = v
	return err
}

// decodeJSON reads a proto3 JSON message into v. The canonical mapping
// lets a parser accept the original snake_case field names as well as the
// lowerCamelCase ones; keys are normalized to the latter at the top level
// and in nested objects before decoding. Unknown fields are ignored, as
// connect-go's default does.
func decodeJSON(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON message: %v", err)
	}
	norm, err := json.Marshal(camelKeys(raw))
	if err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON message: %v", err)
	}
	if err := json.Unmarshal(norm, v); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid JSON message: %v", err)
	}
	return nil
}

// camelKeys rewrites snake_case object keys to lowerCamelCase, except in
// the map fields of the envd messages, whose keys are data.
func camelKeys(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, val := range t {
			ck := camel(k)
			if ck == "envs" || ck == "metadata" { // map<string, string> fields
				out[ck] = val
				continue
			}
			out[ck] = camelKeys(val)
		}
		return out
	case []any:
		for i := range t {
			t[i] = camelKeys(t[i])
		}
	}
	return v
}

func camel(s string) string {
	if !strings.Contains(s, "_") {
		return s
	}
	var b strings.Builder
	up := false
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// jsonUint32 is a uint32 in proto3 JSON: a number or a decimal string.
type jsonUint32 uint32

func (u *jsonUint32) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" {
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("invalid uint32 %s", b)
	}
	*u = jsonUint32(v)
	return nil
}

// jsonBytes is a bytes field in proto3 JSON: base64, standard or URL-safe
// alphabet, with or without padding.
type jsonBytes []byte

func (j *jsonBytes) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("invalid bytes value %s", b)
	}
	s = strings.TrimRight(s, "=")
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.RawURLEncoding
	}
	v, err := enc.DecodeString(s)
	if err != nil {
		return fmt.Errorf("invalid base64 in bytes value: %w", err)
	}
	*j = v
	return nil
}

// enumValue reads a proto3 JSON enum: its name in names, or its number.
func enumValue(b []byte, names map[string]int32) (int32, error) {
	var s string
	if json.Unmarshal(b, &s) == nil {
		if v, ok := names[s]; ok {
			return v, nil
		}
		return 0, fmt.Errorf("unknown enum value %q", s)
	}
	var n int32
	if err := json.Unmarshal(b, &n); err != nil {
		return 0, fmt.Errorf("invalid enum value %s", b)
	}
	return n, nil
}

// timestamp is a google.protobuf.Timestamp.
type timestamp struct{ t time.Time }

func (ts timestamp) appendProto(b []byte) []byte {
	e := pbEnc(b)
	e.int64(1, ts.t.Unix())
	e.uvarint(2, uint64(ts.t.Nanosecond()))
	return e
}

func (ts *timestamp) parseProto(b []byte) error {
	var sec, nsec int64
	err := parseFields(b, func(f pbField) error {
		switch f.num {
		case 1:
			sec = int64(f.v)
		case 2:
			nsec = int64(f.v)
		}
		return nil
	})
	ts.t = time.Unix(sec, nsec).UTC()
	return err
}

// MarshalJSON writes RFC 3339 in UTC with 0 or 9 fractional digits: the
// JSON mapping allows 0, 3, 6 or 9, and some parsers accept no other count.
func (ts timestamp) MarshalJSON() ([]byte, error) {
	layout := "2006-01-02T15:04:05Z"
	if ts.t.Nanosecond() != 0 {
		layout = "2006-01-02T15:04:05.000000000Z"
	}
	return json.Marshal(ts.t.UTC().Format(layout))
}
