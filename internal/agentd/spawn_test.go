package agentd

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestProcessesStartOnlyThroughForkExec: under gVisor only the spawner's
// thread carries the seccomp filter, so a process started any other way
// would run unfiltered there. The agent's code may start processes only
// with the procTable's forkExec; syscall.ForkExec appears only as its
// default and in the spawner.
func TestProcessesStartOnlyThroughForkExec(t *testing.T) {
	allowed := map[string]bool{"proc.go": true, "spawner.go": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == "os/exec" {
				t.Errorf("%s imports os/exec", name)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch pkg.Name + "." + sel.Sel.Name {
			case "os.StartProcess", "unix.ForkExec", "syscall.StartProcess", "syscall.Exec", "unix.Exec":
				t.Errorf("%s: %s.%s starts a process outside the spawner", fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name)
			case "syscall.ForkExec":
				if !allowed[name] {
					t.Errorf("%s: syscall.ForkExec outside proc.go and spawner.go", fset.Position(sel.Pos()))
				}
			}
			return true
		})
	}
}
