package postbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/postbox-events/postbox"
)

// TestNackCodesInProtocol: docs/PROTOCOL.md's table of NACK codes is the
// Code constants of errors.go, in their order, each retryable as
// Code.Retryable says.
func TestNackCodesInProtocol(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []postbox.Code
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, val := range v.Values {
				lit, ok := val.(*ast.BasicLit)
				if !ok {
					t.Fatalf("errors.go: a Code constant that is not a string literal: %T", val)
				}
				s, _ := strconv.Unquote(lit.Value)
				codes = append(codes, postbox.Code(s))
			}
		}
	}
	if len(codes) < 5 {
		t.Fatalf("errors.go: found %d Code constants: is the scan looking in the right place?", len(codes))
	}
	yes := map[bool]string{false: "no", true: "**yes**"}
	var want []string
	for _, c := range codes {
		want = append(want, "| `"+string(c)+"` | "+yes[c.Retryable()]+" |")
	}

	data, err := os.ReadFile("docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	i := slices.Index(lines, "| code | retryable | meaning |")
	if i < 0 {
		t.Fatal("docs/PROTOCOL.md: no table of NACK codes (| code | retryable | meaning |)")
	}
	var got []string
	for _, l := range lines[i+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.SplitN(l, "|", 4) // "", code, retryable, meaning
		got = append(got, "|"+cells[1]+"|"+cells[2]+"|")
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/PROTOCOL.md: the NACK codes are\n%s\nwant, from errors.go and Code.Retryable:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
