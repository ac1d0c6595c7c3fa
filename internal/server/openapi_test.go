package server

import (
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/corralrun/corral/internal/audit"
	"github.com/corralrun/corral/internal/cluster"
	"github.com/corralrun/corral/internal/driver"
	"github.com/corralrun/corral/internal/errdefs"
	"github.com/corralrun/corral/internal/events"
	"github.com/corralrun/corral/internal/interpreter"
	"github.com/corralrun/corral/internal/ociimage"
	"github.com/corralrun/corral/internal/sandbox"
	"github.com/corralrun/corral/internal/storage"
	"github.com/corralrun/corral/internal/wire"
)

// openAPIDoc is the part of an OpenAPI 3 document the tests look at.
type openAPIDoc struct {
	OpenAPI    string                                `json:"openapi"`
	Paths      map[string]map[string]json.RawMessage `json:"paths"`
	Components struct {
		Responses map[string]openAPIResponse `json:"responses"`
		Schemas   map[string]openAPISchema   `json:"schemas"`
	} `json:"components"`
}

type openAPIOperation struct {
	OperationID string                     `json:"operationId"`
	Responses   map[string]openAPIResponse `json:"responses"`
}

type openAPIResponse struct {
	Ref     string `json:"$ref"`
	Content map[string]struct {
		Schema struct {
			Ref string `json:"$ref"`
		} `json:"schema"`
	} `json:"content"`
}

type openAPISchema struct {
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
	Enum       []string                   `json:"enum"`
}

const errorSchemaRef = "#/components/schemas/ErrorBody"

// A path item holds operations keyed by lower-case method, next to fields
// such as "parameters" that are not operations.
var openAPIMethods = map[string]string{
	"get": http.MethodGet, "put": http.MethodPut, "post": http.MethodPost,
	"delete": http.MethodDelete, "options": http.MethodOptions, "head": http.MethodHead,
	"patch": http.MethodPatch, "trace": http.MethodTrace,
}

func parseOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	var doc openAPIDoc
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json is not valid JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version = %q, want 3.x", doc.OpenAPI)
	}
	return doc
}

// operations returns the document's operations keyed by "METHOD /path",
// the form of the patterns in routes().
func operations(t *testing.T, doc openAPIDoc) map[string]openAPIOperation {
	t.Helper()
	ops := map[string]openAPIOperation{}
	for path, item := range doc.Paths {
		for key, raw := range item {
			method, ok := openAPIMethods[key]
			if !ok {
				continue
			}
			var op openAPIOperation
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			ops[method+" "+path] = op
		}
	}
	return ops
}

// TestOpenAPIMatchesRoutes fails when a route is added, removed or renamed
// without updating openapi.json, or the other way round.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	ops := operations(t, parseOpenAPI(t))
	var documented, served []string
	for k := range ops {
		documented = append(documented, k)
	}
	for _, r := range (&Server{}).routes() {
		served = append(served, r.pattern)
	}
	slices.Sort(documented)
	slices.Sort(served)
	for _, p := range served {
		if _, ok := slices.BinarySearch(documented, p); !ok {
			t.Errorf("route %q is not documented in openapi.json", p)
		}
	}
	for _, p := range documented {
		if _, ok := slices.BinarySearch(served, p); !ok {
			t.Errorf("openapi.json documents %q, which routes() does not serve", p)
		}
	}
	if len(served) != len(slices.Compact(slices.Clone(served))) {
		t.Errorf("routes() has duplicate patterns: %q", served)
	}
}

func TestOpenAPIOperations(t *testing.T) {
	doc := parseOpenAPI(t)
	seenIDs := map[string]string{}
	for name, op := range operations(t, doc) {
		t.Run(name, func(t *testing.T) {
			id := op.OperationID
			switch {
			case id == "":
				t.Error("no operationId")
			case id[0] < 'a' || id[0] > 'z' || strings.ContainsAny(id, "_- "):
				t.Errorf("operationId %q is not lowerCamelCase", id)
			}
			if other, ok := seenIDs[id]; ok && id != "" {
				t.Errorf("operationId %q is also used by %s", id, other)
			}
			seenIDs[id] = name

			var errStatuses []string
			for status, resp := range op.Responses {
				if status[0] != '4' && status[0] != '5' {
					continue
				}
				if resp.Ref != "" {
					ref, ok := strings.CutPrefix(resp.Ref, "#/components/responses/")
					if !ok {
						t.Errorf("response %s: $ref %q is not under #/components/responses/", status, resp.Ref)
						continue
					}
					shared, ok := doc.Components.Responses[ref]
					if !ok {
						t.Errorf("response %s: $ref %q does not exist", status, resp.Ref)
						continue
					}
					resp = shared
				}
				if got := resp.Content["application/json"].Schema.Ref; got != errorSchemaRef {
					t.Errorf("response %s: application/json schema is %q, want %q", status, got, errorSchemaRef)
					continue
				}
				errStatuses = append(errStatuses, status)
			}
			if len(errStatuses) == 0 {
				t.Errorf("no 4xx/5xx response with schema %s", errorSchemaRef)
			}
		})
	}
}

// TestOpenAPISchemasMatchTypes keeps the documented object schemas in step
// with the Go types the server encodes and decodes: the properties are the
// JSON field names, and the required ones are those without omitempty.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc := parseOpenAPI(t)
	types := map[string][]any{
		"ErrorBody":            {wire.ErrorBody{}},
		"ErrorDetail":          {wire.ErrorDetail{}, errorDetail{}, events.ErrorDetail{}},
		"VersionInfo":          {VersionInfo{}},
		"RuntimeInfo":          {sandbox.RuntimeInfo{}},
		"Capabilities":         {driver.Capabilities{}},
		"Sandbox":              {SandboxView{}},
		"CreateSandboxRequest": {CreateRequest{}},
		"TimeoutRequest":       {TimeoutRequest{}},
		"UpdateRequest":        {UpdateRequest{}},
		"NetworkPolicy":        {NetworkPolicy{}},
		"HeaderRule":           {HeaderRule{}},
		"PlaceholderRule":      {PlaceholderRule{}},
		"Mount":                {Mount{}},
		"Change":               {Change{}},
		"Stats":                {driver.Stats{}},
		"ExecRequest":          {wire.ExecRequest{}},
		"ExecEvent":            {wire.ExecEvent{}},
		"RunRequest":           {RunRequest{}},
		"RunEvent":             {RunEvent{}},
		"FileInfo":             {wire.FileInfo{}},
		"MkdirRequest":         {wire.MkdirRequest{}},
		"RenameRequest":        {wire.RenameRequest{}},
		"Template":             {sandbox.Template{}},
		"TemplateDefaults":     {sandbox.Defaults{}, ociimage.Defaults{}},
		"PullRequest":          {PullRequest{}},
		"Progress":             {ociimage.Progress{}},
		"BuildRequest":         {BuildRequest{}},
		"BuildEvent":           {BuildEvent{}},
		"StartRequest":         {wire.StartRequest{}},
		"PTYSize":              {wire.PTYSize{}},
		"ProcessInfo":          {wire.ProcessInfo{}},
		"SignalRequest":        {wire.SignalRequest{}},
		"WatchEvent":           {wire.WatchEvent{}},
		"AttachControl":        {AttachControl{}},
		"AttachEvent":          {AttachEvent{}},
		"Event":                {events.Event{}},
		"PoolRequest":          {PoolRequest{}},
		"Pool":                 {PoolView{}},
		"Snapshot":             {SnapshotView{}},
		"SnapshotRequest":      {SnapshotRequest{}},
		"ForkRequest":          {ForkRequest{}},
		"ResumeRequest":        {ResumeRequest{}},
		"StartSandboxRequest":  {StartSandboxRequest{}},
		"FromSnapshotRequest":  {FromSnapshotRequest{}},
		"ReadySnapshotRequest": {ReadySnapshotRequest{}},
		"Health":               {Health{}},
		"DiskQuota":            {storage.QuotaStatus{}},
		"Volume":               {sandbox.Volume{}},
		"VolumeRequest":        {VolumeRequest{}},
		"Service":              {sandbox.Service{}},
		"ReadyCheck":           {wire.ReadyCheck{}},
		"ServiceStatus":        {wire.ServiceStatus{}},
		"CodeRequest":          {CodeRequest{}},
		"CodeEvent":            {CodeEvent{}},
		"CodeContext":          {interpreter.ContextInfo{}},
		"CodeContextRequest":   {CodeContextRequest{}},
		"KeyRequest":           {KeyRequest{}},
		"Key":                  {KeyView{}},
		"SecretRequest":        {SecretRequest{}},
		"RotateSecretRequest":  {RotateSecretRequest{}},
		"Secret":               {SecretView{}},
		"AuditRecord":          {audit.Record{}},
		"Node":                 {cluster.Node{}},
		"NodeCapacity":         {cluster.Capacity{}},
		"NodeLoad":             {cluster.Load{}},
	}
	for name, s := range doc.Components.Schemas {
		if s.Properties != nil && types[name] == nil {
			t.Errorf("schema %s has no Go type in this test; add it", name)
		}
	}
	for name, values := range types {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s is missing", name)
			continue
		}
		var props []string
		for p := range s.Properties {
			props = append(props, p)
		}
		slices.Sort(props)
		required := slices.Sorted(slices.Values(s.Required))
		for _, v := range values {
			fields, wantRequired := jsonFields(reflect.TypeOf(v))
			if !slices.Equal(props, fields) {
				t.Errorf("schema %s properties = %q, %T fields = %q", name, props, v, fields)
			}
			if !slices.Equal(required, wantRequired) {
				t.Errorf("schema %s required = %q, want %q (the fields of %T without omitempty)", name, required, wantRequired, v)
			}
		}
	}
}

// jsonFields returns the sorted JSON names of a struct's fields and, of
// those, the ones always present in its encoding. The fields of an
// embedded struct without a JSON name count as the outer struct's, as
// encoding/json promotes them.
func jsonFields(typ reflect.Type) (names, always []string) {
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			n, a := jsonFields(f.Type)
			names, always = append(names, n...), append(always, a...)
			continue
		}
		if !f.IsExported() || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
			always = append(always, name)
		}
	}
	slices.Sort(names)
	slices.Sort(always)
	return names, always
}

func TestOpenAPIErrorCodes(t *testing.T) {
	doc := parseOpenAPI(t)
	want := []string{
		errdefs.CodeInvalidArgument, errdefs.CodeNotFound, errdefs.CodeAlreadyExists,
		errdefs.CodeFailedPrecondition, errdefs.CodeResourceExhausted, errdefs.CodeBusy, errdefs.CodeUnavailable,
		errdefs.CodeUnauthenticated, errdefs.CodePermissionDenied, errdefs.CodeNotImplemented,
		errdefs.CodeInternal,
	}
	got := slices.Sorted(slices.Values(doc.Components.Schemas["ErrorCode"].Enum))
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ErrorCode enum = %q, want %q", got, want)
	}
}

// TestOpenAPIRanges keeps the minimum and maximum of every numeric field
// of a request in step with the range the server checks (sandbox.Range),
// and fails for a numeric request field without one.
func TestOpenAPIRanges(t *testing.T) {
	doc := parseOpenAPI(t)
	limits := []sandbox.Range{sandbox.RangeCPUs, sandbox.RangeMemory, sandbox.RangePids}
	lifetime := []sandbox.Range{sandbox.RangeTimeout, sandbox.RangeIdleTimeout}
	exec := []sandbox.Range{sandbox.RangeExecTimeout, sandbox.RangeExecOutput}
	pty := []sandbox.Range{sandbox.RangePTYCols, sandbox.RangePTYRows}
	bySchema := map[string][]sandbox.Range{
		"CreateSandboxRequest": slices.Concat(limits, []sandbox.Range{sandbox.RangeDisk}, lifetime),
		"PoolRequest":          slices.Concat(limits, []sandbox.Range{sandbox.RangeDisk, sandbox.RangePoolSize}),
		"UpdateRequest":        append(slices.Clone(limits), sandbox.RangeIdleTimeout),
		"TimeoutRequest":       {sandbox.RangeTimeout},
		"ResumeRequest":        {sandbox.RangeTimeout},
		"StartSandboxRequest":  {sandbox.RangeTimeout},
		"ExecRequest":          exec,
		"StartRequest":         exec,
		"CodeRequest":          {sandbox.RangeExecTimeout, sandbox.RangeCodeOutput},
		"PTYSize":              pty,
		"AttachControl":        pty,
		"ForkRequest":          {sandbox.RangeForkCount},
		"MkdirRequest":         {sandbox.RangeFileMode},
		"VolumeRequest":        {sandbox.RangeVolumeSize},
		"KeyRequest": {sandbox.RangeQuotaSandboxes, sandbox.RangeQuotaMemory, sandbox.RangeQuotaCPUs, sandbox.RangeQuotaDisk,
			sandbox.RangeCreateRate},
	}
	ranges := map[string]sandbox.Range{}
	for schema, list := range bySchema {
		for _, r := range list {
			ranges[schema+"."+r.Field] = r
		}
	}
	for name, s := range doc.Components.Schemas {
		if !strings.HasSuffix(name, "Request") && name != "PTYSize" && name != "AttachControl" {
			continue
		}
		for prop, raw := range s.Properties {
			var p struct {
				Type     string   `json:"type"`
				Minimum  *float64 `json:"minimum"`
				Maximum  *float64 `json:"maximum"`
				Nullable bool     `json:"nullable"`
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s.%s: %v", name, prop, err)
			}
			if p.Type != "integer" && p.Type != "number" {
				continue
			}
			key := name + "." + prop
			r, ok := ranges[key]
			switch {
			case !ok:
				t.Errorf("%s is numeric but has no range in this test (and perhaps none in the server)", key)
			case p.Minimum == nil || p.Maximum == nil:
				t.Errorf("%s: no minimum or maximum", key)
			case *p.Minimum != r.APIMin() || *p.Maximum != r.APIMax():
				t.Errorf("%s: minimum %v, maximum %v; the server checks %v to %v", key, *p.Minimum, *p.Maximum, r.APIMin(), r.APIMax())
			}
			delete(ranges, key)
		}
	}
	for key := range ranges {
		t.Errorf("%s is not in openapi.json", key)
	}
}

// TestOpenAPIEventTypes keeps the event types GET /v1/events documents
// equal to those it accepts.
func TestOpenAPIEventTypes(t *testing.T) {
	var op struct {
		Parameters []struct {
			Name   string `json:"name"`
			Schema struct {
				Items struct {
					Enum []string `json:"enum"`
				} `json:"items"`
			} `json:"schema"`
		} `json:"parameters"`
	}
	if err := json.Unmarshal(parseOpenAPI(t).Paths["/v1/events"]["get"], &op); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range op.Parameters {
		if p.Name == "type" {
			got = slices.Sorted(slices.Values(p.Schema.Items.Enum))
		}
	}
	if want := slices.Sorted(slices.Values(events.Types)); !slices.Equal(got, want) {
		t.Errorf("documented event types %q, accepted %q", got, want)
	}
}
