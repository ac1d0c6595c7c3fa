package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/corralrun/corral/internal/errdefs"
)

// The envd messages are Go structs whose fields carry their protobuf field
// numbers in a `pb` tag, read by appendProto and parseProto: generated
// code would bring a code generator into the build for a few small
// messages. The binary encoding follows the protobuf wire format; JSON
// follows the canonical proto3 JSON mapping (lowerCamelCase names, int64
// as strings, bytes as base64, enums by name, defaults omitted) through
// the fields' `json` tags. Field numbers and types are those of E2B's
// process.proto and filesystem.proto.
//
// A `pb` tag is the field number, then options after commas:
//
//	zigzag  the field is a sint32 or sint64 (an int32 or int64 in Go)
//	oneof   the field is a oneof member: written whenever it is set, even
//	        when empty (a pointer that is not nil, a []byte that is not nil)
//
// The protobuf type follows from the Go type:
//
//	bool, int32, int64, uint32, uint64, string  that scalar (int32 also for enums)
//	[]byte                                      bytes
//	struct                                      an embedded message, always written
//	pointer to one of these                     proto3 optional: present when not nil
//	[]string, []struct                          repeated, every element written
//	map[string]string                           map<string, string>
//
// A scalar, string or bytes field at its zero value is left out, as
// proto3 says, unless a pointer or oneof says that it is set. The oneof
// members of a message form one oneof (E2B's messages have at most one).
// The encoder writes every member that is set (callers set one); the
// decoder keeps the last member it reads and clears the others, as
// protobuf parsers do, merging a message member that comes twice.
//
// Every exported field of a message has a `pb` tag. A tag or a type the
// codec cannot carry is a programming error and panics; a test encodes
// and decodes every message type. Tags are read on every call (a few
// fields per message) once per message type and call (pbCodec) rather than
// cached for good, which would be package-level state;
// BenchmarkAppendProto measures the cost.

// pbCodec reads the tags of each message type once per call: a repeated
// message (a directory listing's entries) would read them per element.
type pbCodec struct {
	fields map[reflect.Type][]pbField
}

// fieldsOf returns pbFields(t), read at its first use in this call.
func (c *pbCodec) fieldsOf(t reflect.Type) []pbField {
	if f, ok := c.fields[t]; ok {
		return f
	}
	if c.fields == nil {
		c.fields = map[reflect.Type][]pbField{}
	}
	f := pbFields(t)
	c.fields[t] = f
	return f
}

// pbField is one field of a message struct, as its tag describes it.
type pbField struct {
	num    protowire.Number
	index  int // in the struct
	zigzag bool
	oneof  bool
	wire   protowire.Type // in which its values arrive (checkType)
}

// pbFields reads the `pb` tags of the message struct type t.
func pbFields(t reflect.Type) []pbField {
	fields := make([]pbField, 0, t.NumField())
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		f, err := parseTag(sf)
		if err == nil && slices.ContainsFunc(fields, func(g pbField) bool { return g.num == f.num }) {
			err = fmt.Errorf("field number %d is used twice", f.num)
		}
		if err != nil {
			panic(fmt.Sprintf("protobuf message %s, field %s: %v", t, sf.Name, err))
		}
		fields = append(fields, f)
	}
	return fields
}

func parseTag(sf reflect.StructField) (pbField, error) {
	tag, ok := sf.Tag.Lookup("pb")
	if !ok {
		return pbField{}, fmt.Errorf("no pb tag")
	}
	numText, opts, _ := strings.Cut(tag, ",")
	num, err := strconv.ParseInt(numText, 10, 32)
	f := pbField{num: protowire.Number(num), index: sf.Index[0]}
	if err != nil || !f.num.IsValid() || f.num >= protowire.FirstReservedNumber && f.num <= protowire.LastReservedNumber {
		return f, fmt.Errorf("invalid field number %q", numText)
	}
	for o := range strings.SplitSeq(opts, ",") {
		switch o {
		case "":
		case "zigzag":
			f.zigzag = true
		case "oneof":
			f.oneof = true
		default:
			return f, fmt.Errorf("unknown pb option %q", o)
		}
	}
	f.wire, err = checkType(sf.Type, f)
	return f, err
}

// checkType returns the wire type in which a field of type t arrives
// (its element's for optional and repeated fields, length-delimited for
// bytes and map entries), or an error unless the codec carries t.
func checkType(t reflect.Type, f pbField) (protowire.Type, error) {
	elem := t
	switch {
	case t.Kind() == reflect.Pointer:
		elem = t.Elem()
	case isBytes(t):
	case t.Kind() == reflect.Slice:
		if k := t.Elem().Kind(); k != reflect.String && k != reflect.Struct {
			return 0, fmt.Errorf("repeated %s is not supported (only strings and messages)", t.Elem())
		}
		elem = t.Elem()
	case t.Kind() == reflect.Map:
		if t.Key().Kind() != reflect.String || t.Elem().Kind() != reflect.String {
			return 0, fmt.Errorf("%s is not supported (only map<string, string>)", t)
		}
		elem = t.Elem()
	}
	wire, ok := wireType(elem)
	if !ok {
		return 0, fmt.Errorf("type %s is not supported", t)
	}
	if f.oneof && t.Kind() != reflect.Pointer && !isBytes(t) {
		return 0, fmt.Errorf("oneof member of type %s: want a pointer or []byte", t)
	}
	if k := elem.Kind(); f.zigzag && k != reflect.Int32 && k != reflect.Int64 {
		return 0, fmt.Errorf("zigzag on type %s: want int32 or int64", t)
	}
	return wire, nil
}

func isBytes(t reflect.Type) bool {
	return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8
}

// wireType is the wire type of one value of type t.
func wireType(t reflect.Type) (protowire.Type, bool) {
	switch t.Kind() {
	case reflect.Bool, reflect.Int32, reflect.Int64, reflect.Uint32, reflect.Uint64:
		return protowire.VarintType, true
	case reflect.String, reflect.Struct:
		return protowire.BytesType, true
	}
	return protowire.BytesType, isBytes(t)
}

// mapEntry is the message that carries one entry of a map<string, string>.
type mapEntry struct {
	Key   string `pb:"1"`
	Value string `pb:"2"`
}

// appendProto appends the binary encoding of m, a message struct or a
// pointer to one. Map entries are written in key order.
func appendProto(b []byte, m any) []byte {
	var c pbCodec
	return c.appendMessage(b, reflect.Indirect(reflect.ValueOf(m)))
}

func (c *pbCodec) appendMessage(b []byte, v reflect.Value) []byte {
	for _, f := range c.fieldsOf(v.Type()) {
		b = c.appendField(b, f, v.Field(f.index))
	}
	return b
}

func (c *pbCodec) appendField(b []byte, f pbField, v reflect.Value) []byte {
	switch {
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			return b
		}
		return c.appendValue(b, f, v.Elem(), true)
	case isBytes(v.Type()):
		return c.appendValue(b, f, v, f.oneof && !v.IsNil())
	case v.Kind() == reflect.Slice:
		for i := range v.Len() {
			b = c.appendValue(b, f, v.Index(i), true)
		}
		return b
	case v.Kind() == reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(x, y reflect.Value) int { return strings.Compare(x.String(), y.String()) })
		for _, k := range keys {
			entry := mapEntry{Key: k.String(), Value: v.MapIndex(k).String()}
			b = c.appendValue(b, f, reflect.ValueOf(entry), true)
		}
		return b
	}
	return c.appendValue(b, f, v, v.Kind() == reflect.Struct)
}

// appendValue appends one value of field f. A zero value is left out
// unless present says that the field is set.
func (c *pbCodec) appendValue(b []byte, f pbField, v reflect.Value, present bool) []byte {
	if !present && (v.IsZero() || v.Kind() == reflect.Slice && v.Len() == 0) {
		return b
	}
	b = protowire.AppendTag(b, f.num, f.wire)
	switch v.Kind() {
	case reflect.String:
		return protowire.AppendString(b, v.String())
	case reflect.Slice:
		return protowire.AppendBytes(b, v.Bytes())
	case reflect.Struct:
		return protowire.AppendBytes(b, c.appendMessage(nil, v))
	case reflect.Bool:
		return protowire.AppendVarint(b, protowire.EncodeBool(v.Bool()))
	case reflect.Int32, reflect.Int64:
		if f.zigzag {
			return protowire.AppendVarint(b, protowire.EncodeZigZag(v.Int()))
		}
		// A negative int32 is sign-extended to ten bytes, as protobuf says.
		return protowire.AppendVarint(b, uint64(v.Int()))
	}
	return protowire.AppendVarint(b, v.Uint())
}

// parseProto reads the binary encoding of a message into m, a pointer to
// a message struct. As protobuf says, unknown fields are skipped, a
// scalar seen twice keeps its last value, a repeated field or a map
// appends, an embedded message seen twice is merged, and a 32-bit field
// keeps the low 32 bits of its varint. A known field in another wire type
// than its own is skipped like an unknown one, as protobuf-go does (a
// peer with a newer schema may have changed its type). Malformed input (a
// truncated value, an overlong varint) is an invalid_argument error that
// names the field.
func parseProto(b []byte, m any) error {
	var c pbCodec
	if err := c.parseMessage(b, reflect.ValueOf(m).Elem()); err != nil {
		return errdefs.Errorf(errdefs.ErrInvalidArgument, "invalid protobuf message: %v", err)
	}
	return nil
}

func (c *pbCodec) parseMessage(b []byte, v reflect.Value) error {
	fields := c.fieldsOf(v.Type())
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var err error
		i := slices.IndexFunc(fields, func(f pbField) bool { return f.num == num })
		if i >= 0 && typ == fields[i].wire {
			if fields[i].oneof {
				for _, o := range fields {
					if o.oneof && o.num != num {
						v.Field(o.index).SetZero()
					}
				}
			}
			n, err = c.parseField(b, fields[i], typ, v.Field(fields[i].index))
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			err = protowire.ParseError(n)
		}
		if err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
		b = b[n:]
	}
	return nil
}

// parseField reads one occurrence of field f, of wire type typ, from b
// into v, and returns the length it read.
func (c *pbCodec) parseField(b []byte, f pbField, typ protowire.Type, v reflect.Value) (int, error) {
	switch {
	case v.Kind() == reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		return c.parseValue(b, f, typ, v.Elem())
	case isBytes(v.Type()):
	case v.Kind() == reflect.Slice:
		elem := reflect.New(v.Type().Elem()).Elem()
		n, err := c.parseValue(b, f, typ, elem)
		if err == nil {
			v.Set(reflect.Append(v, elem))
		}
		return n, err
	case v.Kind() == reflect.Map:
		var e mapEntry
		n, err := c.parseValue(b, f, typ, reflect.ValueOf(&e).Elem())
		if err == nil {
			if v.IsNil() {
				v.Set(reflect.MakeMap(v.Type()))
			}
			v.SetMapIndex(reflect.ValueOf(e.Key).Convert(v.Type().Key()), reflect.ValueOf(e.Value).Convert(v.Type().Elem()))
		}
		return n, err
	}
	return c.parseValue(b, f, typ, v)
}

// parseValue reads one value of field f, in its own wire type typ
// (parseMessage skips the others), into v.
func (c *pbCodec) parseValue(b []byte, f pbField, typ protowire.Type, v reflect.Value) (int, error) {
	if typ == protowire.VarintType {
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(x != 0)
		case reflect.Int32:
			if f.zigzag {
				x = uint64(protowire.DecodeZigZag(x & 0xffffffff))
			}
			v.SetInt(int64(int32(x)))
		case reflect.Int64:
			if f.zigzag {
				x = uint64(protowire.DecodeZigZag(x))
			}
			v.SetInt(int64(x))
		default:
			v.SetUint(x) // SetUint keeps the low 32 bits of a uint32
		}
		return n, nil
	}
	data, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(string(data))
	case reflect.Slice:
		v.SetBytes(append([]byte{}, data...)) // data is the caller's buffer
	default:
		return n, c.parseMessage(data, v)
	}
	return n, nil
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
