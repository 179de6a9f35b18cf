package server_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/postbox-events/postbox/api"
)

// The tests here keep the one table of error codes (api.Codes) true:
// docs/openapi.json and docs/API.md say what it says, and the server
// writes no code but through it.

// TestErrorCodesInOpenAPI: the enum of the Error schema's code is the
// table's codes, and each response that names the codes it carries lists
// only codes of its own status.
func TestErrorCodesInOpenAPI(t *testing.T) {
	spec := loadOpenAPI(t)
	schema := spec.schemas()["components.schemas.Error"]
	enum, _ := jget(schema, "properties", "error", "properties", "code", "enum").([]any)
	var table, inSpec []string
	status := map[string]int{}
	for _, c := range api.Codes() {
		table = append(table, string(c.Code))
		status[string(c.Code)] = c.Status
	}
	for _, e := range enum {
		inSpec = append(inSpec, fmt.Sprint(e))
	}
	if !slices.Equal(inSpec, table) {
		t.Errorf("docs/openapi.json: Error.error.code enum is\n%q\nwant the codes of api.Codes, in its order:\n%q", inSpec, table)
	}

	checked := 0
	for op, o := range spec.ops {
		responses, _ := o["responses"].(map[string]any)
		for st, resp := range responses {
			schema := jget(spec.resolve(resp), "content", "application/json", "schema")
			codes, _ := jget(schema, "properties", "error", "properties", "code", "enum").([]any)
			for _, c := range codes {
				checked++
				want, ok := status[fmt.Sprint(c)]
				switch {
				case !ok:
					t.Errorf("docs/openapi.json: %s %s lists the code %q, which api.Codes does not have", op, st, c)
				case strconv.Itoa(want) != st:
					t.Errorf("docs/openapi.json: %s lists the code %q under %s; the server answers it with %d", op, c, st, want)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("docs/openapi.json: no response lists its error codes: the walk above found nothing to check")
	}
}

// errorsTable is the table of codes as docs/API.md shows it.
func errorsTable() []string {
	rows := []string{"| status | code | when |", "|---|---|---|"}
	for _, c := range api.Codes() {
		rows = append(rows, fmt.Sprintf("| %d | `%s` | %s |", c.Status, c.Code, c.When))
	}
	return rows
}

// TestErrorCodesInAPIDoc: docs/API.md's table of errors is api.Codes, row
// for row.
func TestErrorCodesInAPIDoc(t *testing.T) {
	data, err := os.ReadFile("../../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	want := errorsTable()
	i := slices.Index(lines, want[0])
	if i < 0 {
		t.Fatalf("docs/API.md: no line %q starts the table of errors", want[0])
	}
	var got []string
	for _, l := range lines[i:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		got = append(got, l)
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/API.md: the table of errors is\n%s\nwant, from api.Codes:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestErrorCodesTyped: no error the server writes names its code or its
// status by hand. writeError takes an api.Code and the table gives the
// status, so a string literal or an http.Status… beside it is a second
// copy of the table.
func TestErrorCodesTyped(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				fn, _ := n.Fun.(*ast.Ident)
				if fn == nil || (fn.Name != "writeError" && fn.Name != "ceInvalid") {
					return true
				}
				calls++
				codeArg := 1 // writeError(w, code, format, args...)
				if fn.Name == "ceInvalid" {
					codeArg = 0 // ceInvalid(code, format, args...)
				}
				for i, a := range n.Args {
					if i == codeArg && isStringLit(a) || isHTTPStatus(a) {
						t.Errorf("%s: %s with %s: pass an api.Code, whose status is in its table", fset.Position(a.Pos()), fn.Name, exprText(a))
					}
				}
			case *ast.KeyValueExpr:
				if k, ok := n.Key.(*ast.Ident); ok && strings.EqualFold(k.Name, "code") && isStringLit(n.Value) {
					t.Errorf("%s: %s: %s is a string literal: use an api.Code", fset.Position(n.Pos()), k.Name, exprText(n.Value))
				}
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok && id.Name == "code" && i < len(n.Rhs) && isStringLit(n.Rhs[i]) {
						t.Errorf("%s: code = %s: use an api.Code", fset.Position(n.Pos()), exprText(n.Rhs[i]))
					}
				}
			}
			return true
		})
	}
	if calls < 50 {
		t.Fatalf("found %d calls of writeError and ceInvalid in internal/server, want the 100 or so there are: is the scan looking in the right place?", calls)
	}
}

func isStringLit(e ast.Expr) bool {
	l, ok := e.(*ast.BasicLit)
	return ok && l.Kind == token.STRING
}

func isHTTPStatus(e ast.Expr) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == "http" && strings.HasPrefix(s.Sel.Name, "Status")
}

func exprText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Value
	case *ast.SelectorExpr:
		return exprText(e.X) + "." + e.Sel.Name
	case *ast.Ident:
		return e.Name
	}
	return fmt.Sprintf("%T", e)
}
