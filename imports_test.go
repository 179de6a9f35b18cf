package postbox_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestImportsStandardLibraryOnly: the package imports the standard
// library only, as its doc says: no other package of postbox and no
// third-party module (whose import paths start with a domain name).
func TestImportsStandardLibraryOnly(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range pkg.Imports {
		if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
			t.Errorf("package postbox imports %s", path)
		}
	}
}
