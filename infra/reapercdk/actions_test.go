package reapercdk

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// apiCalls lists the AWS operations a package's non-test code calls: every
// <recv>.client.<Op>(...) and <service>.New<Op>Paginator(...), outside the
// functions in skip.
func apiCalls(t *testing.T, dir string, skip ...string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	paginator := regexp.MustCompile(`^New(\w+)Paginator$`)
	seen := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && slices.Contains(skip, fn.Name.Name) {
				continue
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "client" {
					seen[sel.Sel.Name] = true
				}
				if m := paginator.FindStringSubmatch(sel.Sel.Name); m != nil {
					seen[m[1]] = true
				}
				return true
			})
		}
	}
	var out []string
	for op := range seen {
		out = append(out, op)
	}
	sort.Strings(out)
	return out
}

func operations(service string, actions ...[]string) []string {
	var out []string
	for _, list := range actions {
		for _, a := range list {
			out = append(out, strings.TrimPrefix(a, service+":"))
		}
	}
	sort.Strings(out)
	return out
}

// sqsActions are the IAM actions that authorize the SQS operations the
// code calls: SendMessageBatch has no action of its own.
var sqsActions = map[string]string{"SendMessage": "sqs:SendMessage", "SendMessageBatch": "sqs:SendMessage"}

// TestGrantsMatchCode keeps IAM in step with the code: a new ledger, EC2
// or SQS call fails here until the construct grants it (and nothing more).
func TestGrantsMatchCode(t *testing.T) {
	// CreateTable serves `reaper ledger init` on local stacks, not Lambda.
	if got, want := apiCalls(t, "../../pkg/ledger", "CreateTable"), operations("dynamodb", ledgerActions, batchReadActions, sweepIndexActions); !slices.Equal(got, want) {
		t.Errorf("pkg/ledger calls %v, the functions are granted %v", got, want)
	}
	if got, want := apiCalls(t, "../../pkg/instances"), []string{"CreateTags", "DescribeInstances", "TerminateInstances"}; !slices.Equal(got, want) {
		t.Errorf("pkg/instances calls %v, the functions are granted %v", got, want)
	}
	// The producers send; receiving and deleting are the event source
	// mapping's, on the reconciler's behalf.
	calls := apiCalls(t, "../../pkg/workqueue")
	if want := []string{"SendMessageBatch"}; !slices.Equal(calls, want) {
		t.Errorf("pkg/workqueue calls %v, want %v", calls, want)
	}
	var needed []string
	for _, op := range calls {
		action, ok := sqsActions[op]
		if !ok {
			t.Errorf("pkg/workqueue calls %s, which no grant covers", op)
			continue
		}
		needed = append(needed, action)
	}
	slices.Sort(needed)
	if needed = slices.Compact(needed); !slices.Equal(needed, produceActions) {
		t.Errorf("pkg/workqueue needs %v, the producers are granted %v", needed, produceActions)
	}
}
