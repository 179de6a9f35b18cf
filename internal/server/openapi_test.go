package server_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/postbox-events/postbox/client"
	"github.com/postbox-events/postbox/internal/delivery"
	"github.com/postbox-events/postbox/internal/ingress"
	"github.com/postbox-events/postbox/internal/server"
	"github.com/postbox-events/postbox/internal/webhooksig"
)

// The tests here keep docs/openapi.json true: it describes every route the
// server registers and no other, and real requests get the statuses,
// headers and bodies it documents.

// openAPI is docs/openapi.json, its numbers decoded as json.Number.
type openAPI struct {
	doc map[string]any
	ops map[string]map[string]any // "GET /v1/streams" → its operation
}

var httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadOpenAPI(t *testing.T) *openAPI {
	t.Helper()
	data, err := os.ReadFile("../../docs/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := decodeJSON(data, &doc); err != nil {
		t.Fatalf("docs/openapi.json: %v", err)
	}
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		t.Fatalf("docs/openapi.json: openapi %q, want 3.1.x", v)
	}
	spec := &openAPI{doc: doc, ops: map[string]map[string]any{}}
	paths, _ := doc["paths"].(map[string]any)
	for path, item := range paths {
		for method, op := range item.(map[string]any) {
			if !slices.Contains(httpMethods, method) {
				t.Fatalf("docs/openapi.json: %s: %q is not a method this test reads", path, method)
			}
			spec.ops[strings.ToUpper(method)+" "+path] = op.(map[string]any)
		}
	}
	return spec
}

func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON value")
	}
	return nil
}

// pointer returns what a local reference ("#/components/schemas/Item")
// points to.
func (s *openAPI) pointer(ref string) (any, error) {
	var v any = s.doc
	for _, name := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := v.(map[string]any)
		if !ok || m[name] == nil {
			return nil, fmt.Errorf("$ref %q: nothing there", ref)
		}
		v = m[name]
	}
	return v, nil
}

// resolve returns o, or what it points to when it is a reference.
func (s *openAPI) resolve(o any) map[string]any {
	m, _ := o.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		v, _ := s.pointer(ref)
		m, _ = v.(map[string]any)
	}
	return m
}

// annotations are keywords that say nothing the validator checks.
var annotations = []string{"description", "title", "default", "examples"}

// validate checks v against schema for the subset of JSON Schema 2020-12
// that docs/openapi.json uses. Any other keyword is an error, so the spec
// cannot promise more than this test checks.
func (s *openAPI) validate(schema, v any, at string) error {
	sch, ok := schema.(map[string]any)
	if !ok {
		return fmt.Errorf("%s: schema %v is not an object", at, schema)
	}
	obj, isObj := v.(map[string]any)
	arr, isArr := v.([]any)
	str, isStr := v.(string)
	num, isNum := v.(json.Number)
	for k, kv := range sch {
		var err error
		switch k {
		case "$ref": // applies beside the other keywords, as in 2020-12
			target, perr := s.pointer(kv.(string))
			if err = perr; err == nil {
				err = s.validate(target, v, at)
			}
		case "type":
			types, _ := kv.([]any)
			if t, ok := kv.(string); ok {
				types = []any{t}
			}
			got := jsonType(v)
			if !slices.Contains(types, any(got)) && !(got == "integer" && slices.Contains(types, any("number"))) {
				err = fmt.Errorf("%s: a JSON %s, want %v", at, got, kv)
			}
		case "enum":
			if !slices.ContainsFunc(kv.([]any), func(e any) bool { return reflect.DeepEqual(e, v) }) {
				err = fmt.Errorf("%s: %v is not one of %v", at, v, kv)
			}
		case "required":
			for _, name := range kv.([]any) {
				if _, ok := obj[name.(string)]; isObj && !ok {
					err = fmt.Errorf("%s: no field %q", at, name)
					break
				}
			}
		case "properties":
			for name, ps := range kv.(map[string]any) {
				if pv, ok := obj[name]; ok && err == nil {
					err = s.validate(ps, pv, at+"."+name)
				}
			}
		case "additionalProperties":
			props, _ := sch["properties"].(map[string]any)
			for name, pv := range obj {
				if _, ok := props[name]; ok || err != nil {
					continue
				}
				if kv == false {
					err = fmt.Errorf("%s: field %q is not in the spec", at, name)
				} else {
					err = s.validate(kv, pv, at+"."+name)
				}
			}
		case "anyOf":
			var errs []error
			for _, alt := range kv.([]any) {
				if aerr := s.validate(alt, v, at); aerr != nil {
					errs = append(errs, aerr)
				}
			}
			if len(errs) == len(kv.([]any)) {
				err = fmt.Errorf("%s: matches none of anyOf: %w", at, errors.Join(errs...))
			}
		case "items":
			for i, e := range arr {
				if err == nil {
					err = s.validate(kv, e, fmt.Sprintf("%s[%d]", at, i))
				}
			}
		case "minItems", "maxItems":
			n, _ := strconv.Atoi(kv.(json.Number).String())
			if isArr && (k == "minItems" && len(arr) < n || k == "maxItems" && len(arr) > n) {
				err = fmt.Errorf("%s: %d items, %s %d", at, len(arr), k, n)
			}
		case "minimum", "maximum":
			lim, _ := kv.(json.Number).Float64()
			f, _ := num.Float64()
			if isNum && (k == "minimum" && f < lim || k == "maximum" && f > lim) {
				err = fmt.Errorf("%s: %v, %s %v", at, num, k, kv)
			}
		case "pattern":
			if isStr && !regexp.MustCompile(kv.(string)).MatchString(str) {
				err = fmt.Errorf("%s: %q does not match %s", at, str, kv)
			}
		case "format":
			if kv != "date-time" {
				err = fmt.Errorf("%s: format %q: not one this test checks", at, kv)
			} else if _, perr := time.Parse(time.RFC3339Nano, str); isStr && perr != nil {
				err = fmt.Errorf("%s: %q is not an RFC 3339 time", at, str)
			}
		default:
			if !slices.Contains(annotations, k) {
				err = fmt.Errorf("%s: keyword %q: not one this test's validator knows", at, k)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if strings.ContainsAny(v.String(), ".eE") {
			return "number"
		}
		return "integer"
	case []any:
		return "array"
	default:
		return "object"
	}
}

// schemas returns every schema of the spec, under components and in each
// operation's request body and responses, named by where it is.
func (s *openAPI) schemas() map[string]any {
	out := map[string]any{}
	comps, _ := s.doc["components"].(map[string]any)
	for name, sch := range comps["schemas"].(map[string]any) {
		out["components.schemas."+name] = sch
	}
	addContent := func(at string, holder any) {
		content, _ := s.resolve(holder)["content"].(map[string]any)
		for mt, m := range content {
			out[at+" "+mt] = m.(map[string]any)["schema"]
		}
	}
	for name, op := range s.ops {
		addContent(name+" request", op["requestBody"])
		for status, r := range op["responses"].(map[string]any) {
			addContent(name+" "+status, r)
		}
	}
	return out
}

// TestOpenAPIRoutes: the operations of docs/openapi.json are exactly the
// routes the server registers, each declares its path parameters, and its
// schemas use only keywords the validator of these tests checks.
func TestOpenAPIRoutes(t *testing.T) {
	spec := loadOpenAPI(t)
	srv, err := server.NewDefault(server.Config{DBPath: filepath.Join(t.TempDir(), "postbox.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	routes := srv.Routes()
	for _, r := range routes {
		if spec.ops[r] == nil {
			t.Errorf("the server serves %s, which docs/openapi.json does not describe", r)
		}
	}
	for op, o := range spec.ops {
		if !slices.Contains(routes, op) {
			t.Errorf("docs/openapi.json describes %s, which the server does not serve", op)
		}
		var declared []string
		params, _ := o["parameters"].([]any)
		for _, p := range params {
			if p := p.(map[string]any); p["in"] == "path" {
				declared = append(declared, p["name"].(string))
			}
		}
		inPath := regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(op, -1)
		for _, m := range inPath {
			if !slices.Contains(declared, m[1]) {
				t.Errorf("%s: path parameter %q is not declared", op, m[1])
			}
		}
		if len(declared) != len(inPath) {
			t.Errorf("%s: declares path parameters %v", op, declared)
		}
		if len(o["responses"].(map[string]any)) == 0 {
			t.Errorf("%s: no responses", op)
		}
	}
	// OpenAPI: paths that differ only in their parameters' names are one
	// path, and may not be two items (GET /webhooks/{id} beside POST
	// /webhooks/{source} was such a pair).
	templates := map[string]string{}
	for path := range spec.doc["paths"].(map[string]any) {
		shape := regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(path, "{}")
		if other, ok := templates[shape]; ok {
			t.Errorf("docs/openapi.json: paths %s and %s differ only in parameter names: make them one path item", path, other)
		}
		templates[shape] = path
	}
	// The validator meets a keyword only where an answer leads it: look
	// through every schema for keywords it does not know.
	for at, sch := range spec.schemas() {
		walkKeywords(t, spec, sch, at)
	}
}

// walkKeywords fails for a keyword of schema, or of a schema within it,
// that the validator does not know.
func walkKeywords(t *testing.T, spec *openAPI, schema any, at string) {
	sch, ok := schema.(map[string]any)
	if !ok {
		t.Errorf("%s: schema is not an object", at)
		return
	}
	for k, kv := range sch {
		switch k {
		case "properties":
			for name, ps := range kv.(map[string]any) {
				walkKeywords(t, spec, ps, at+"."+name)
			}
		case "items":
			walkKeywords(t, spec, kv, at+"[]")
		case "anyOf":
			for i, alt := range kv.([]any) {
				walkKeywords(t, spec, alt, fmt.Sprintf("%s|%d", at, i))
			}
		case "additionalProperties":
			if kv != false {
				walkKeywords(t, spec, kv, at+".*")
			}
		case "$ref":
			if _, err := spec.pointer(kv.(string)); err != nil {
				t.Errorf("%s: %v", at, err)
			}
		case "type", "enum", "required", "minItems", "maxItems", "minimum", "maximum", "pattern":
		case "format":
			if kv != "date-time" {
				t.Errorf("%s: format %q: not one the validator checks", at, kv)
			}
		default:
			if !slices.Contains(annotations, k) {
				t.Errorf("%s: keyword %q: not one the validator knows", at, k)
			}
		}
	}
}

// apiChecker sends requests for the operations of the spec and checks the
// answers against it, remembering which statuses it saw.
type apiChecker struct {
	spec *openAPI
	mu   sync.Mutex
	seen map[string]map[string]bool // operation → statuses answered
}

// do sends op ("POST /v1/inboxes/{inbox}/lease") to target (its path with
// the parameters filled in, and a query) on base, checks the answer and
// returns its status and its decoded JSON body (nil when it has none). A
// POST body is sent as application/json unless hdr says otherwise.
func (c *apiChecker) do(t testing.TB, hc *http.Client, base, op, target, body string, hdr map[string]string) (int, any) {
	t.Helper()
	method, _, _ := strings.Cut(op, " ")
	req, err := http.NewRequest(method, base+target, strings.NewReader(body))
	if err != nil {
		t.Errorf("%s: %v", op, err)
		return 0, nil
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, target, err)
		return 0, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("%s %s: reading the answer: %v", method, target, err)
	}
	return resp.StatusCode, c.check(t, op, body, resp, data)
}

// check checks an answer to op against the spec: its status is listed, its
// required headers are there, its body has a listed media type and, when
// JSON, validates against its schema. The body of a request that succeeded
// must validate against the request schema too.
func (c *apiChecker) check(t testing.TB, op, reqBody string, resp *http.Response, data []byte) any {
	t.Helper()
	o := c.spec.ops[op]
	if o == nil {
		t.Errorf("%s: not in docs/openapi.json", op)
		return nil
	}
	status := strconv.Itoa(resp.StatusCode)
	r := c.spec.resolve(o["responses"].(map[string]any)[status])
	if r == nil {
		t.Errorf("%s answered %s, which docs/openapi.json does not list: %s", op, status, data)
		return nil
	}
	c.mu.Lock()
	if c.seen[op] == nil {
		c.seen[op] = map[string]bool{}
	}
	c.seen[op][status] = true
	c.mu.Unlock()
	headers, _ := r["headers"].(map[string]any)
	for name, h := range headers {
		if h.(map[string]any)["required"] == true && resp.Header.Get(name) == "" {
			t.Errorf("%s %s: no %s header", op, status, name)
		}
	}
	content, _ := r["content"].(map[string]any)
	if len(content) == 0 {
		if len(data) > 0 {
			t.Errorf("%s %s: a body the spec does not document: %s", op, status, data)
		}
		return nil
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	m, ok := content[mt].(map[string]any)
	if !ok {
		t.Errorf("%s %s: Content-Type %q, the spec lists %v", op, status, resp.Header.Get("Content-Type"), slices.Sorted(maps.Keys(content)))
		return nil
	}
	if mt != "application/json" {
		return string(data)
	}
	var v any
	if err := decodeJSON(data, &v); err != nil {
		t.Errorf("%s %s: the body is not JSON (%v): %s", op, status, err, data)
		return nil
	}
	if err := c.spec.validate(m["schema"], v, "body"); err != nil {
		t.Errorf("%s %s: the body does not match docs/openapi.json: %v\n%s", op, status, err, data)
	}
	if reqBody != "" && resp.StatusCode < 300 {
		rb := c.spec.resolve(o["requestBody"])
		if m, ok := rb["content"].(map[string]any)["application/json"].(map[string]any); ok {
			var req any
			if err := decodeJSON([]byte(reqBody), &req); err != nil {
				t.Errorf("%s: the request body is not JSON: %v", op, err)
			} else if err := c.spec.validate(m["schema"], req, "request"); err != nil {
				t.Errorf("%s: a request the server took does not match docs/openapi.json: %v\n%s", op, err, reqBody)
			}
		}
	}
	return v
}

// jget returns the value at keys (field names and indexes) within v.
func jget(v any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

// unexercised says why no request of TestOpenAPIAnswers gets status of op,
// or "" when one must.
func unexercised(op, status string) string {
	switch {
	case status == "503" && op != "GET /ready" && op != "POST /webhooks" && op != "POST /webhooks/{source}":
		return "only when the store fails"
	case op == "POST /webhooks/{source}" && status == "429":
		return "as POST /webhooks, whose writer queue it shares"
	case op == "GET /metrics" && status == "500":
		return "only when gathering a metric fails"
	case op == "POST /v1/subscriptions/{name}/replay" && status == "409":
		return "only while a replay of the subscription runs"
	case op == "GET /v1/backup" && status == "501":
		return "only on a PostgreSQL store (TestBackupRoute)"
	}
	return ""
}

// TestOpenAPIAnswers sends each operation of docs/openapi.json from a real
// client to real servers and checks every answer against it; every
// documented status is reached unless unexercised says why not.
func TestOpenAPIAnswers(t *testing.T) {
	spec := loadOpenAPI(t)
	c := &apiChecker{spec: spec, seen: map[string]map[string]bool{}}
	big := `{"name": "` + strings.Repeat("x", 1<<20) + `"}`

	// An open server, with a small webhook limit; a nacked item that was
	// leased once is a dead letter.
	ts := start(t, server.Config{Webhooks: server.WebhookConfig{MaxBytes: 4096}, Delivery: delivery.Config{MaxAttempts: 1}}, nil)
	do := func(op, target, body string, hdr map[string]string) (int, any) {
		t.Helper()
		return c.do(t, ts.HTTP, ts.Base, op, target, body, hdr)
	}
	want := func(wantStatus int, op, target, body string, hdr map[string]string) any {
		t.Helper()
		status, v := do(op, target, body, hdr)
		if status != wantStatus {
			t.Errorf("%s %s: %d %v, want %d", op, target, status, v, wantStatus)
		}
		return v
	}
	want(200, "GET /health", "/health", "", nil)
	want(200, "GET /ready", "/ready", "", nil)
	want(200, "GET /metrics", "/metrics", "", nil)
	want(200, "GET /v1/stats", "/v1/stats", "", nil)
	want(200, "GET /v1/backup", "/v1/backup", "", nil)
	want(403, "GET /v1/backup", "/v1/backup", "", map[string]string{"Sec-Fetch-Site": "cross-site"})
	for _, file := range []string{"/ui/", "/ui/app.js", "/ui/style.css"} {
		want(200, "GET /ui/", file, "", nil)
	}
	want(404, "GET /ui/", "/ui/no-such-file.js", "", nil)

	const ws = "GET " + ingress.WSPath
	conn, resp, err := websocket.Dial(testCtx(t, 10*time.Second), ts.WS, &websocket.DialOptions{HTTPClient: ts.HTTP, Subprotocols: []string{ingress.Subprotocol}})
	if err != nil {
		t.Fatalf("WebSocket: %v", err)
	}
	c.check(t, ws, "", resp, nil)
	conn.Close(websocket.StatusNormalClosure, "")
	upgrade := map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	want(426, ws, ingress.WSPath, "", nil)
	want(400, ws, ingress.WSPath, "", map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "12", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
	upgrade["Origin"] = "http://elsewhere.example"
	want(403, ws, ingress.WSPath, "", upgrade)
	delete(upgrade, "Origin")
	want(404, ws, ingress.WSPath+"?source=nosuch", "", upgrade)
	upgrade["Origin"] = "http://elsewhere.example"

	// Subscriptions.
	const subs = "POST /v1/subscriptions"
	def := `{"name": "planner", "source": "devices", "types": ["sensor.*"], "metadata": {"device_id": "pi-7"}, "start": "earliest"}`
	want(201, subs, "/v1/subscriptions", def, nil)
	want(200, subs, "/v1/subscriptions", def, nil)
	want(201, subs, "/v1/subscriptions", `{"name": "from-1", "source": "devices", "inbox": "audit", "start": "at_offset", "start_offset": 1}`, nil)
	want(201, subs, "/v1/subscriptions", `{"name": "hooked", "source": "devices", "types": ["never.*"], "target": "http://127.0.0.1:9/events"}`, nil)
	want(400, subs, "/v1/subscriptions", `{"name": "x", "source": "devices", "target": "ftp://127.0.0.1/"}`, nil)
	want(409, subs, "/v1/subscriptions", `{"name": "planner", "source": "devices"}`, nil)
	want(404, subs, "/v1/subscriptions", `{"name": "nowhere", "source": "no-such-source"}`, nil)
	want(400, subs, "/v1/subscriptions", `{"source": "devices"}`, nil)
	want(400, subs, "/v1/subscriptions", `{"name": "x", "source": "devices", "colour": "red"}`, nil)
	want(413, subs, "/v1/subscriptions", big, nil)
	want(200, "GET /v1/subscriptions", "/v1/subscriptions", "", nil)
	want(200, "GET /v1/subscriptions/{name}", "/v1/subscriptions/planner", "", nil)
	want(201, subs, "/v1/subscriptions", `{"name": "by-order", "source": "devices", "types": ["never.*"], "order_by": "/order/id", "on_dead_letter": "skip"}`, nil)
	want(200, "GET /v1/subscriptions/{name}", "/v1/subscriptions/by-order", "", nil)
	want(200, "PATCH /v1/subscriptions/{name}", "/v1/subscriptions/by-order", `{"on_dead_letter": "block"}`, nil)
	want(400, "PATCH /v1/subscriptions/{name}", "/v1/subscriptions/by-order", `{"on_dead_letter": "drop"}`, nil)
	want(404, "GET /v1/subscriptions/{name}", "/v1/subscriptions/nope", "", nil)
	const patch = "PATCH /v1/subscriptions/{name}"
	want(200, patch, "/v1/subscriptions/hooked", `{"target": "http://127.0.0.1:9/other"}`, nil)
	want(200, patch, "/v1/subscriptions/hooked", `{"target": null}`, nil)
	want(400, patch, "/v1/subscriptions/hooked", `{"target": "ftp://127.0.0.1/"}`, nil)
	want(404, patch, "/v1/subscriptions/nope", `{"target": null}`, nil)
	want(201, subs, "/v1/subscriptions", `{"name": "audit-too", "source": "devices", "inbox": "audit", "types": ["never.*"]}`, nil)
	want(409, patch, "/v1/subscriptions/from-1", `{"target": "http://127.0.0.1:9/audit"}`, nil)
	want(413, patch, "/v1/subscriptions/hooked", big, nil)
	// An endpoint: a secret, headers, a timeout, a schedule; then rotated.
	want(201, subs, "/v1/subscriptions", `{"name": "signed", "source": "devices", "types": ["never.*"], "target": "http://127.0.0.1:9/s",
		"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "headers": {"X-Team": "billing"}, "timeout": "10s", "retry_schedule": "5s,1m", "max_attempts": 8}`, nil)
	want(400, subs, "/v1/subscriptions", `{"name": "x", "source": "devices", "target": "http://127.0.0.1:9/", "secret": "not-whsec"}`, nil)
	want(200, patch, "/v1/subscriptions/signed", `{"secret": "whsec_dGhpcyBpcyBhIHRlc3Qgc2VjcmV0IG9mIDMyIGJ5dGVzIQ==", "secret_overlap": "1h",
		"retry_schedule": null, "retry_base_delay": "1s", "retry_max_delay": "1m", "headers": null, "timeout": null, "max_attempts": null}`, nil)
	want(400, patch, "/v1/subscriptions/signed", `{"retry_schedule": "5s,later"}`, nil)
	// Flow settings, and enabling an endpoint's breaker.
	want(200, patch, "/v1/subscriptions/signed", `{"rate": "50/s", "concurrency": 4, "breaker_failures": 0, "breaker_probe": "10s",
		"disable_after": "1h"}`, nil)
	want(400, patch, "/v1/subscriptions/signed", `{"rate": "fast"}`, nil)
	const enable = "POST /v1/subscriptions/{name}/enable"
	want(200, enable, "/v1/subscriptions/signed/enable", "", nil)
	want(400, enable, "/v1/subscriptions/planner/enable", "", nil)
	want(404, enable, "/v1/subscriptions/nope/enable", "", nil)
	// Pause, resume and a test event.
	const pause, resume, testOp = "POST /v1/subscriptions/{name}/pause", "POST /v1/subscriptions/{name}/resume", "POST /v1/subscriptions/{name}/test"
	want(200, pause, "/v1/subscriptions/hooked/pause", `{"reason": "deploy"}`, nil)
	want(200, pause, "/v1/subscriptions/hooked/pause", "", nil)
	want(400, pause, "/v1/subscriptions/hooked/pause", `{"why": "deploy"}`, nil)
	want(404, pause, "/v1/subscriptions/nope/pause", "", nil)
	want(413, pause, "/v1/subscriptions/hooked/pause", big, nil)
	want(200, resume, "/v1/subscriptions/hooked/resume", "", nil)
	want(400, resume, "/v1/subscriptions/hooked/resume", `{"reason": "x"}`, nil)
	want(404, resume, "/v1/subscriptions/nope/resume", "", nil)
	want(200, testOp, "/v1/subscriptions/signed/test", "", nil) // nothing listens: ok false, status 0
	want(400, testOp, "/v1/subscriptions/planner/test", "", nil)
	want(404, testOp, "/v1/subscriptions/nope/test", "", nil)
	// A replay of a time range, and its job.
	const rangeReplay = "POST /v1/subscriptions/{name}/replay"
	job, _ := want(202, rangeReplay, "/v1/subscriptions/hooked/replay", `{"since": "2026-01-01T00:00:00Z"}`, nil).(map[string]any)
	want(400, rangeReplay, "/v1/subscriptions/hooked/replay", `{"since": "yesterday"}`, nil)
	want(404, rangeReplay, "/v1/subscriptions/nope/replay", `{"since": "2026-01-01T00:00:00Z"}`, nil)
	want(413, rangeReplay, "/v1/subscriptions/hooked/replay", big, nil)
	want(200, "GET /v1/replays", "/v1/replays?subscription=hooked", "", nil)
	want(400, "GET /v1/replays", "/v1/replays?subscription=no%20such", "", nil)
	want(200, "GET /v1/replays/{id}", fmt.Sprintf("/v1/replays/%v", job["id"]), "", nil)
	want(404, "GET /v1/replays/{id}", "/v1/replays/no-such-job", "", nil)
	want(200, "GET /v1/streams", "/v1/streams", "", nil)
	want(200, "GET /v1/streams/{stream}", "/v1/streams/devices", "", nil)
	want(404, "GET /v1/streams/{stream}", "/v1/streams/nope", "", nil)

	// A device event for planner, two webhooks for the inbox webhooks.
	dc := dial(t, ts.WS, client.Options{})
	if rs := send(t, dc, message(t, envelope("evt-openapi-1", "pi-7", `{"c": 21.5}`))); !rs[0].OK() {
		t.Fatalf("device event: %+v", rs[0])
	}
	const hook = "POST /webhooks"
	key1 := map[string]string{"Idempotency-Key": "oa-1", "X-Event-Type": "invoice.paid"}
	created := want(202, hook, "/webhooks", `{"amount": 42}`, key1)
	want(200, hook, "/webhooks", `{ "amount": 42 }`, key1)
	want(409, hook, "/webhooks", `{"amount": 43}`, key1)
	want(202, hook, "/webhooks", `{"amount": 7}`, map[string]string{"Idempotency-Key": "oa-2"})
	want(400, hook, "/webhooks", `{"amount": 1}`, nil)
	const feedOp = "GET /v1/streams/{stream}/events"
	want(200, feedOp, "/v1/streams/webhooks/events?after=0&limit=2", "", nil)
	want(400, feedOp, "/v1/streams/webhooks/events?after=-1", "", nil)
	want(404, feedOp, "/v1/streams/nowhere/events", "", nil)
	want(413, hook, "/webhooks", `{"pad": "`+strings.Repeat("x", 5000)+`"}`, map[string]string{"Idempotency-Key": "oa-3"})
	// Consumers: one, its reset and its history (none kept by a plain
	// stream backend).
	const consumer, reset, commits = "GET /v1/consumers/{name}", "POST /v1/consumers/{name}/reset", "GET /v1/consumers/{name}/commits"
	want(200, consumer, "/v1/consumers/planner", "", nil)
	want(404, consumer, "/v1/consumers/nope", "", nil)
	want(200, reset, "/v1/consumers/planner/reset", `{"earliest": true}`, nil)
	want(400, reset, "/v1/consumers/planner/reset", `{}`, nil)
	want(404, reset, "/v1/consumers/nope/reset", `{"latest": true}`, nil)
	want(413, reset, "/v1/consumers/planner/reset", big, nil)
	want(200, commits, "/v1/consumers/planner/commits?limit=10", "", nil)
	want(400, commits, "/v1/consumers/planner/commits?limit=0", "", nil)
	want(404, commits, "/v1/consumers/nope/commits", "", nil)
	plainTS, _ := startPlain(t, server.Config{})
	waitFor(t, 10*time.Second, "501 from a backend that keeps no history", func() bool {
		status, _ := c.do(t, plainTS.HTTP, plainTS.Base, commits, "/v1/consumers/webhooks/commits", "", nil)
		return status == 501
	})
	want(415, hook, "/webhooks", `{}`, map[string]string{"Idempotency-Key": "oa-4", "Content-Type": "text/plain"})

	// Sources, and webhooks to one of them.
	const srcs, src, srcHook = "POST /v1/sources", "GET /v1/sources/{name}", "POST /webhooks/{source}"
	gh := `{"name": "gh", "kind": "webhook", "settings": {"preset": "github", "secrets": ["oa-secret"]}}`
	want(201, srcs, "/v1/sources", gh, nil)
	want(200, srcs, "/v1/sources", gh, nil)
	want(409, srcs, "/v1/sources", `{"name": "gh", "kind": "webhook"}`, nil)
	want(201, srcs, "/v1/sources", `{"name": "poller", "kind": "poll", "settings": {"url": "http://127.0.0.1:9/events", "items": "/events",
		"id": "/id", "type": "/type", "cursor_param": "after", "next": "/next", "interval": "1h", "headers": {"Authorization": "env:NO_SUCH_VAR", "X-Key": "k"}}}`, nil)
	want(201, srcs, "/v1/sources", `{"name": "mirror", "kind": "feed", "settings": {"url": "http://127.0.0.1:9/v1/streams/devices", "token": "t"}}`, nil)
	want(200, src, "/v1/sources/poller", "", nil)
	want(400, srcs, "/v1/sources", `{"name": "p2", "kind": "poll", "settings": {"url": "http://x/"}}`, nil)
	want(400, srcs, "/v1/sources", `{"name": "x", "kind": "webhook", "settings": {"preset": "github"}}`, nil)
	want(413, srcs, "/v1/sources", big, nil)
	want(200, "GET /v1/sources", "/v1/sources", "", nil)
	want(200, src, "/v1/sources/gh", "", nil)
	want(200, src, "/v1/sources/devices", "", nil)
	want(404, src, "/v1/sources/nowhere", "", nil)
	ghBody := `{"action": "opened"}`
	ghHdr := map[string]string{"X-GitHub-Delivery": "oa-gh-1", "X-GitHub-Event": "issues", "X-Hub-Signature-256": webhooksig.SignGitHub("oa-secret", []byte(ghBody))}
	want(202, srcHook, "/webhooks/gh", ghBody, ghHdr)
	want(200, srcHook, "/webhooks/gh", ghBody, ghHdr)
	ghHdr["X-GitHub-Delivery"], ghHdr["X-Hub-Signature-256"] = "oa-gh-2", webhooksig.SignGitHub("oa-secret", []byte(`{}`))
	want(202, srcHook, "/webhooks/gh", `{}`, ghHdr)
	ghHdr["X-Hub-Signature-256"] = webhooksig.SignGitHub("oa-secret", []byte(`{"x": 1}`))
	want(409, srcHook, "/webhooks/gh", `{"x": 1}`, ghHdr)
	want(401, srcHook, "/webhooks/gh", ghBody, map[string]string{"X-GitHub-Delivery": "oa-gh-3"})
	want(404, srcHook, "/webhooks/nowhere", `{}`, nil)
	want(400, srcHook, "/webhooks/devices", `{}`, nil)
	want(413, srcHook, "/webhooks/gh", `{"pad": "`+strings.Repeat("x", 5000)+`"}`, ghHdr)
	want(415, srcHook, "/webhooks/gh", `{}`, map[string]string{"Content-Type": "text/plain"})
	const delSrc = "DELETE /v1/sources/{name}"
	want(201, subs, "/v1/subscriptions", `{"name": "gh-reader", "source": "gh"}`, nil)
	want(409, delSrc, "/v1/sources/gh", "", nil)
	want(204, "DELETE /v1/subscriptions/{name}", "/v1/subscriptions/gh-reader", "", nil)
	want(204, delSrc, "/v1/sources/gh", "", nil)
	want(404, delSrc, "/v1/sources/gh", "", nil)

	// Replies, to a webhook whose handle header names a stand-in that
	// fails the first reply (a dead letter: MaxAttempts is 1) and takes
	// the others.
	var standInCalls atomic.Int32
	standIn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if standInCalls.Add(1) == 1 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer standIn.Close()
	want(201, srcs, "/v1/sources", `{"name": "talk", "kind": "webhook", "settings": {"handle_header": "X-Reply-To"}}`, nil)
	want(201, subs, "/v1/subscriptions", `{"name": "talk-in", "source": "talk"}`, nil)
	want(202, srcHook, "/webhooks/talk", `{"n": 1}`, map[string]string{"Idempotency-Key": "oa-t-1", "X-Reply-To": standIn.URL + "/replies"})
	var talk any
	waitFor(t, 10*time.Second, "the item of oa-t-1", func() bool {
		_, v := do("GET /v1/inboxes/{inbox}/items", "/v1/inboxes/talk-in/items", "", nil)
		talk = jget(v, "items", 0, "id")
		return talk != nil
	})
	const reply, replies, retryReply = "POST /v1/inboxes/{inbox}/items/{id}/reply", "GET /v1/inboxes/{inbox}/items/{id}/replies",
		"POST /v1/inboxes/{inbox}/items/{id}/replies/{key}/retry"
	talkPath := fmt.Sprint("/v1/inboxes/talk-in/items/", talk)
	want(202, reply, talkPath+"/reply", `{"key": "k", "body": {"text": "hi"}}`, nil)
	want(200, reply, talkPath+"/reply", `{"key": "k", "body": {"text": "hi"}}`, nil)
	want(409, reply, talkPath+"/reply", `{"key": "k", "body": {"text": "other"}}`, nil)
	want(400, reply, talkPath+"/reply", `{"key": "k\n", "body": {}}`, nil)
	want(400, reply, talkPath+"/reply", `{"body": {}, "to": "elsewhere"}`, nil)
	want(400, reply, "/v1/inboxes/talk-in/items/first/reply", `{"body": {}}`, nil)
	want(404, reply, "/v1/inboxes/talk-in/items/999999/reply", `{"body": {}}`, nil)
	waitFor(t, 10*time.Second, "the reply to fail", func() bool {
		_, v := do(replies, talkPath+"/replies", "", nil)
		return jget(v, "replies", 0, "state") == "failed"
	})
	want(200, replies, talkPath+"/replies", "", nil)
	want(400, replies, "/v1/inboxes/talk-in/items/first/replies", "", nil)
	want(404, replies, "/v1/inboxes/talk-in/items/999999/replies", "", nil)
	want(202, retryReply, talkPath+"/replies/k/retry", "", nil)
	want(409, retryReply, talkPath+"/replies/k/retry", "", nil) // pending or, sent, completed
	want(404, retryReply, talkPath+"/replies/no-such-key/retry", "", nil)
	want(400, retryReply, "/v1/inboxes/talk-in/items/first/replies/k/retry", "", nil)

	// Inboxes: wait for the items, then page, lease, ack and nack them.
	const items = "GET /v1/inboxes/{inbox}/items"
	for _, inbox := range []string{"planner", "webhooks"} {
		waitFor(t, 10*time.Second, "items in "+inbox, func() bool {
			_, v := do(items, "/v1/inboxes/"+inbox+"/items", "", nil)
			n, _ := jget(v, "items").([]any)
			return len(n) == map[string]int{"planner": 1, "webhooks": 2}[inbox]
		})
	}
	want(200, "GET /v1/consumers", "/v1/consumers", "", nil)
	want(200, "GET /v1/inboxes", "/v1/inboxes", "", nil)
	page := want(200, items, "/v1/inboxes/webhooks/items?state=pending&limit=1", "", nil)
	if jget(page, "next_after") == json.Number("0") {
		t.Errorf("a full page of 1 has next_after 0: %v", page)
	}
	want(200, items, "/v1/inboxes/no-such-inbox/items", "", nil)
	want(400, items, "/v1/inboxes/webhooks/items?state=lost", "", nil)
	want(400, items, "/v1/inboxes/webhooks/items?limit=0", "", nil)
	first := jget(page, "items", 0, "id")
	const item = "GET /v1/inboxes/{inbox}/items/{id}"
	want(200, item, fmt.Sprint("/v1/inboxes/webhooks/items/", first), "", nil)
	want(400, item, "/v1/inboxes/webhooks/items/first", "", nil)
	want(404, item, "/v1/inboxes/webhooks/items/999999", "", nil)
	const attempts = "GET /v1/inboxes/{inbox}/items/{id}/attempts"
	want(200, attempts, fmt.Sprint("/v1/inboxes/webhooks/items/", first, "/attempts"), "", nil)
	want(400, attempts, "/v1/inboxes/webhooks/items/first/attempts", "", nil)
	want(404, attempts, "/v1/inboxes/webhooks/items/999999/attempts", "", nil)

	const lease = "POST /v1/inboxes/{inbox}/lease"
	l := want(200, lease, "/v1/inboxes/webhooks/lease", `{"max": 1, "visibility_timeout": "30s", "wait": "0s"}`, nil)
	pl := want(200, lease, "/v1/inboxes/planner/lease", "", nil)
	want(400, lease, "/v1/inboxes/webhooks/lease", `{"max": 0}`, nil)
	want(400, lease, "/v1/inboxes/webhooks/lease", `{"wait": "2m"}`, nil)
	want(413, lease, "/v1/inboxes/webhooks/lease", big, nil)
	leased, token := jget(l, "items", 0, "id"), jget(l, "lease")
	const extend = "POST /v1/inboxes/{inbox}/extend"
	res := want(200, extend, "/v1/inboxes/webhooks/extend", fmt.Sprintf(`{"ids": [%v, 999999], "lease": %q, "visibility_timeout": "1m"}`, leased, token), nil)
	if jget(res, "items", 0, "state") != "processing" || jget(res, "items", 1, "error", "code") != "not_found" || jget(res, "expires_at") == nil {
		t.Errorf("extend: %v", res)
	}
	want(400, extend, "/v1/inboxes/webhooks/extend", fmt.Sprintf(`{"ids": [%v]}`, leased), nil)
	want(400, extend, "/v1/inboxes/webhooks/extend", fmt.Sprintf(`{"ids": [%v], "lease": %q, "visibility_timeout": "13h"}`, leased, token), nil)
	want(413, extend, "/v1/inboxes/webhooks/extend", big, nil)
	const ack, nack = "POST /v1/inboxes/{inbox}/ack", "POST /v1/inboxes/{inbox}/nack"
	res = want(200, ack, "/v1/inboxes/webhooks/ack", fmt.Sprintf(`{"ids": [%v, 999999], "lease": %q}`, leased, token), nil)
	if jget(res, "items", 0, "state") != "completed" || jget(res, "items", 1, "error", "code") != "not_found" {
		t.Errorf("ack: %v", res)
	}
	want(400, ack, "/v1/inboxes/webhooks/ack", `{"ids": []}`, nil)
	want(400, ack, "/v1/inboxes/webhooks/ack", `{"ids": [1], "reason": "not for ack"}`, nil)
	want(413, ack, "/v1/inboxes/webhooks/ack", big, nil)
	other := jget(want(200, items, "/v1/inboxes/webhooks/items?state=pending", "", nil), "items", 0, "id")
	res = want(200, nack, "/v1/inboxes/webhooks/nack", fmt.Sprintf(`{"ids": [%v, %v], "delay": "1m", "reason": "downstream 503"}`, other, leased), nil)
	if jget(res, "items", 0, "state") != "pending" || jget(res, "items", 1, "error", "code") == nil {
		t.Errorf("nack: %v", res)
	}
	want(400, nack, "/v1/inboxes/webhooks/nack", `{"ids": [0]}`, nil)
	want(400, nack, "/v1/inboxes/webhooks/nack", `{"ids": [1], "dead": true, "delay": "1m"}`, nil)
	want(400, nack, "/v1/inboxes/webhooks/nack", `{"ids": [1], "delay": "soon"}`, nil)
	want(413, nack, "/v1/inboxes/webhooks/nack", big, nil)

	// Dead letters: the device item, leased once and nacked.
	dead := jget(pl, "items", 0, "id")
	res = want(200, nack, "/v1/inboxes/planner/nack", fmt.Sprintf(`{"ids": [%v], "lease": %q, "reason": "no handler"}`, dead, jget(pl, "lease")), nil)
	if jget(res, "items", 0, "state") != "failed" {
		t.Errorf("nack of a last attempt: %v, want failed", res)
	}
	const dls, dl, replay, replaySel = "GET /v1/dead-letters", "GET /v1/dead-letters/{id}", "POST /v1/dead-letters/{id}/replay", "POST /v1/dead-letters/replay"
	if page := want(200, dls, "/v1/dead-letters?inbox=planner&from=2026-01-01T00:00:00Z&limit=10", "", nil); jget(page, "items", 0, "id") != dead {
		t.Errorf("dead letters of planner: %v, want item %v", page, dead)
	}
	want(400, dls, "/v1/dead-letters?from=yesterday", "", nil)
	want(200, dl, fmt.Sprint("/v1/dead-letters/", dead), "", nil)
	want(404, dl, fmt.Sprint("/v1/dead-letters/", leased), "", nil)
	want(400, dl, "/v1/dead-letters/first", "", nil)
	if it := want(200, replay, fmt.Sprintf("/v1/dead-letters/%v/replay", dead), "", nil); jget(it, "state") != "pending" || jget(it, "replays") != json.Number("1") {
		t.Errorf("replayed: %v", it)
	}
	want(409, replay, fmt.Sprintf("/v1/dead-letters/%v/replay", dead), "", nil)
	want(404, replay, "/v1/dead-letters/999999/replay", "", nil)
	want(400, replay, "/v1/dead-letters/first/replay", "", nil)
	want(200, replaySel, "/v1/dead-letters/replay", `{"inbox": "planner", "from": "2026-01-01T00:00:00Z"}`, nil)
	want(200, replaySel, "/v1/dead-letters/replay", `{"all": true}`, nil)
	want(400, replaySel, "/v1/dead-letters/replay", `{}`, nil)
	want(400, replaySel, "/v1/dead-letters/replay", `{"to": "tomorrow"}`, nil)
	want(413, replaySel, "/v1/dead-letters/replay", big, nil)

	// Cancel and discard an item, and dead letters by selection.
	const cancel, discard, discardSel = "POST /v1/inboxes/{inbox}/items/{id}/cancel", "POST /v1/inboxes/{inbox}/items/{id}/discard", "POST /v1/dead-letters/discard"
	if it := want(200, cancel, fmt.Sprintf("/v1/inboxes/planner/items/%v/cancel", dead), `{"reason": "not needed"}`, nil); jget(it, "state") != "failed" {
		t.Errorf("cancelled: %v", it)
	}
	want(409, cancel, fmt.Sprintf("/v1/inboxes/planner/items/%v/cancel", dead), "", nil)
	want(404, cancel, "/v1/inboxes/planner/items/999999/cancel", "", nil)
	want(400, cancel, "/v1/inboxes/planner/items/first/cancel", "", nil)
	want(413, cancel, fmt.Sprintf("/v1/inboxes/planner/items/%v/cancel", dead), big, nil)
	want(200, discardSel, "/v1/dead-letters/discard", fmt.Sprintf(`{"ids": [%v], "inbox": "planner"}`, dead), nil)
	want(400, discardSel, "/v1/dead-letters/discard", `{}`, nil)
	want(413, discardSel, "/v1/dead-letters/discard", big, nil)
	want(404, discard, fmt.Sprintf("/v1/inboxes/planner/items/%v/discard", dead), "", nil)
	want(400, discard, "/v1/inboxes/planner/items/first/discard", "", nil)
	want(202, hook, "/webhooks", `{"amount": 5}`, map[string]string{"Idempotency-Key": "oa-5"})
	var busy, busyLease any // an item under lease: processing
	waitFor(t, 10*time.Second, "the item of oa-5 leased", func() bool {
		l := want(200, lease, "/v1/inboxes/webhooks/lease", `{"max": 1}`, nil)
		busy, busyLease = jget(l, "items", 0, "id"), jget(l, "lease")
		return busy != nil
	})
	want(409, discard, fmt.Sprintf("/v1/inboxes/webhooks/items/%v/discard", busy), "", nil)
	want(200, ack, "/v1/inboxes/webhooks/ack", fmt.Sprintf(`{"ids": [%v], "lease": %q}`, busy, busyLease), nil)
	want(200, discard, fmt.Sprintf("/v1/inboxes/webhooks/items/%v/discard", busy), "", nil)

	// Webhooks by id and by key; the nacked one has a last_error.
	const byID, byKey = "GET /webhooks/{source}", "GET /webhooks"
	want(200, byID, fmt.Sprint("/webhooks/", jget(created, "id")), "", nil)
	wh := want(200, byKey, "/webhooks?idempotency_key=oa-2", "", nil)
	if jget(wh, "last_error") != "downstream 503" {
		t.Errorf("the nacked webhook: %v, want last_error", wh)
	}
	want(404, byID, "/webhooks/wh_999999", "", nil)
	want(404, byID, "/webhooks/42", "", nil)
	want(400, byKey, "/webhooks", "", nil)
	want(404, byKey, "/webhooks?idempotency_key=never-sent", "", nil)

	// An event and its deliveries; searches of streams and inboxes.
	const event, lookup, search, inboxSearch = "GET /v1/streams/{stream}/events/{offset}", "GET /v1/streams/{stream}/events",
		"GET /v1/streams/{stream}/search", "GET /v1/inboxes/{inbox}/search"
	if ev := want(200, event, fmt.Sprint("/v1/streams/webhooks/events/", jget(wh, "offset")), "", nil); jget(ev, "deliveries", 0, "subscription") != "webhooks" {
		t.Errorf("the event of webhook oa-2: %v, want its delivery to webhooks", ev)
	}
	want(400, event, "/v1/streams/webhooks/events/first", "", nil)
	want(404, event, "/v1/streams/webhooks/events/999999", "", nil)
	want(200, lookup, "/v1/streams/webhooks/events?key=oa-2", "", nil)
	want(404, lookup, "/v1/streams/webhooks/events?id=never-sent", "", nil)
	want(400, lookup, "/v1/streams/webhooks/events?id=oa-2&after=1", "", nil)
	if page := want(200, search, "/v1/streams/webhooks/search?type=invoice.paid&since=2026-01-01T00:00:00Z&limit=1", "", nil); jget(page, "events", 0, "type") != "invoice.paid" {
		t.Errorf("search by type: %v", page)
	}
	want(400, search, "/v1/streams/webhooks/search?since=yesterday", "", nil)
	want(404, search, "/v1/streams/no-such-stream/search", "", nil)
	if page := want(200, inboxSearch, "/v1/inboxes/webhooks/search?key=oa-2", "", nil); jget(page, "items", 0, "event_id") != "oa-2" {
		t.Errorf("search of an inbox by key: %v", page)
	}
	want(400, inboxSearch, "/v1/inboxes/webhooks/search?state=lost", "", nil)
	// One event_id from two devices: the lookup names the variant.
	if rs := send(t, dc, message(t, envelope("evt-openapi-1", "pi-8", `{"c": 3}`))); !rs[0].OK() {
		t.Fatalf("device event: %+v", rs[0])
	}
	want(409, lookup, "/v1/streams/devices/events?id=evt-openapi-1", "", nil)
	want(200, lookup, "/v1/streams/devices/events?id=evt-openapi-1&variant=pi-8", "", nil)

	const del = "DELETE /v1/subscriptions/{name}"
	want(204, del, "/v1/subscriptions/planner", "", nil)
	want(404, del, "/v1/subscriptions/planner", "", nil)

	// With an API token, exactly the operations that list it need it.
	tok := start(t, server.Config{APIToken: "op-token"}, nil)
	for op, o := range spec.ops {
		method, path, _ := strings.Cut(op, " ")
		target := regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(path, "1")
		body := ""
		if method == "POST" {
			body = "{}"
		}
		needs := slices.ContainsFunc(o["security"].([]any), func(s any) bool { return s.(map[string]any)["apiToken"] != nil })
		if status, v := c.do(t, tok.HTTP, tok.Base, op, target, body, nil); (status == 401) != needs {
			t.Errorf("%s without the API token: %d %v; the spec says it needs it: %v", op, status, v, needs)
		}
	}
	if status, v := c.do(t, tok.HTTP, tok.Base, "GET /v1/streams", "/v1/streams", "", map[string]string{"Authorization": "Bearer op-token"}); status != 200 {
		t.Errorf("with the API token: %d %v", status, v)
	}

	// Device tokens and a webhook secret.
	tokens := ingress.Tokens{}
	tokens.Add("device-token", "pi-1")
	sec := start(t, server.Config{Tokens: tokens, Webhooks: server.WebhookConfig{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}, nil)
	if status, v := c.do(t, sec.HTTP, sec.Base, ws, ingress.WSPath, "", upgrade); status != 401 {
		t.Errorf("WebSocket without a device token: %d %v", status, v)
	}
	if status, v := c.do(t, sec.HTTP, sec.Base, hook, "/webhooks", `{}`, map[string]string{"Idempotency-Key": "k"}); status != 401 {
		t.Errorf("an unsigned webhook: %d %v", status, v)
	}

	// A server that is not running yet: not ready, takes no webhook.
	srv, err := server.NewDefault(server.Config{DBPath: filepath.Join(t.TempDir(), "postbox.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	defer hs.Close()
	base := "http://" + ln.Addr().String()
	if status, v := c.do(t, http.DefaultClient, base, "GET /ready", "/ready", "", nil); status != 503 {
		t.Errorf("/ready before Run: %d %v", status, v)
	}
	if status, v := c.do(t, http.DefaultClient, base, hook, "/webhooks", `{}`, map[string]string{"Idempotency-Key": "k"}); status != 503 {
		t.Errorf("a webhook before Run: %d %v", status, v)
	}
	if status, v := c.do(t, http.DefaultClient, base, "POST /webhooks/{source}", "/webhooks/webhooks", `{}`, map[string]string{"Idempotency-Key": "k"}); status != 503 {
		t.Errorf("a webhook to a source before Run: %d %v", status, v)
	}

	// A full writer queue: 429 with Retry-After.
	full := start(t, server.Config{QueueSize: 1}, nil)
	release := lockDB(t, full.DBPath)
	var wg sync.WaitGroup
	throttled := make(chan struct{}, 8)
	for i := range 8 {
		wg.Go(func() {
			if status, _ := c.do(t, full.HTTP, full.Base, hook, "/webhooks", `{}`, map[string]string{"Idempotency-Key": fmt.Sprint("q", i)}); status == 429 {
				throttled <- struct{}{}
			}
		})
	}
	waitFor(t, 10*time.Second, "a 429", func() bool { return len(throttled) > 0 })
	release()
	wg.Wait()

	// Every documented status was reached, or has a reason not to be.
	for op, o := range spec.ops {
		for status := range o["responses"].(map[string]any) {
			why := unexercised(op, status)
			switch got := c.seen[op][status]; {
			case !got && why == "":
				t.Errorf("%s: no request got the documented %s", op, status)
			case got && why != "":
				t.Errorf("%s: a request got %s, which unexercised says happens %s", op, status, why)
			}
		}
	}
}
