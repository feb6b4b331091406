package doctor_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/reaper-k8s/reaper/pkg/doctor"
	"github.com/reaper-k8s/reaper/pkg/metrics"
)

// The doctor cannot link the CDK app (it would carry the CDK and jsii
// into the operator's tool), so it holds the names the app gives the stack
// and its parts; these tests read the app's source and fail when the two
// part ways.

// parseFile parses a Go file of the repository.
func parseFile(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// stringLit is the value of e when it is a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// TestOutputsAreTheApps: Outputs are the outputs infra/app/main.go makes,
// whether it names one in its call of output or in a table it loops over.
func TestOutputsAreTheApps(t *testing.T) {
	f := parseFile(t, "../../infra/app/main.go")
	var got []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "output" && len(n.Args) > 0 {
				if s, ok := stringLit(n.Args[0]); ok {
					got = append(got, s)
				}
			}
		case *ast.RangeStmt:
			// for _, fn := range []struct{id string; ...}{{"SweeperRoleArn", ...}} { output(fn.id, ...) }
			lit, ok := n.X.(*ast.CompositeLit)
			if !ok || !callsOutput(n.Body) {
				return true
			}
			for _, elt := range lit.Elts {
				if row, ok := elt.(*ast.CompositeLit); ok && len(row.Elts) > 0 {
					if s, ok := stringLit(row.Elts[0]); ok {
						got = append(got, s)
					}
				}
			}
		}
		return true
	})
	slices.Sort(got)
	want := slices.Sorted(slices.Values(doctor.Outputs))
	if !slices.Equal(got, want) {
		t.Errorf("infra/app makes the outputs %v\ndoctor.Outputs are %v", got, want)
	}
}

func callsOutput(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "output" {
				found = true
			}
		}
		return !found
	})
	return found
}

// TestFunctionIDsAreTheConstructs: ConstructID is the id infra/app gives
// the Reaper construct, and FunctionIDs the ids of the functions in
// infra/reapercdk's table, by name.
func TestFunctionIDsAreTheConstructs(t *testing.T) {
	var constructIDs []string
	ast.Inspect(parseFile(t, "../../infra/app/main.go"), func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "New" && len(c.Args) == 3 {
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "reapercdk" {
					s, _ := stringLit(c.Args[1])
					constructIDs = append(constructIDs, s)
				}
			}
		}
		return true
	})
	if !slices.Equal(constructIDs, []string{doctor.ConstructID}) {
		t.Errorf("infra/app creates the Reaper construct with ids %q, want [%s]", constructIDs, doctor.ConstructID)
	}

	// The function table: {name: metrics.FunctionX, id: "X", ...}.
	names := map[string]string{
		"FunctionExitRecorder": metrics.FunctionExitRecorder, "FunctionStateChange": metrics.FunctionStateChange,
		"FunctionSweeper": metrics.FunctionSweeper, "FunctionReconciler": metrics.FunctionReconciler,
	}
	got := map[string]string{}
	ast.Inspect(parseFile(t, "../../infra/reapercdk/reaper.go"), func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		var name, id string
		for _, elt := range lit.Elts {
			kv, ok := elt.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			switch key, _ := kv.Key.(*ast.Ident); {
			case key == nil:
			case key.Name == "name":
				if sel, ok := kv.Value.(*ast.SelectorExpr); ok {
					name = names[sel.Sel.Name]
				}
			case key.Name == "id":
				id, _ = stringLit(kv.Value)
			}
		}
		if name != "" && id != "" {
			got[name] = id
		}
		return true
	})
	if !maps.Equal(got, doctor.FunctionIDs) {
		t.Errorf("infra/reapercdk's functions have the ids %v\ndoctor.FunctionIDs are %v", got, doctor.FunctionIDs)
	}
}

// DefaultStackName names a cluster's stack as the app does (the cases of
// infra/app's TestStackPerCluster).
func TestDefaultStackName(t *testing.T) {
	for cluster, want := range map[string]string{
		"team_a.gpu":             "Reaper-team-a-gpu",
		"prod-1":                 "Reaper-prod-1",
		"équipe":                 "Reaper--quipe",
		strings.Repeat("x", 200): "Reaper-" + strings.Repeat("x", 121),
	} {
		if got := doctor.DefaultStackName(cluster); got != want {
			t.Errorf("DefaultStackName(%q) = %s, want %s", cluster, got, want)
		}
	}
}

// TestPermissionsAreTheRBACs: Permissions are exactly what the ClusterRole
// of deploy/rbac.yaml grants, rule by rule, so the doctor asks about
// everything Reaper is given and nothing more.
func TestPermissionsAreTheRBACs(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var granted []string
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil || role.Kind != "ClusterRole" {
			continue
		}
		for _, rule := range role.Rules {
			for _, res := range rule.Resources {
				for _, verb := range rule.Verbs {
					p := doctor.Permission{Verb: verb}
					p.Resource, p.Subresource, _ = strings.Cut(res, "/")
					if len(rule.ResourceNames) == 0 {
						granted = append(granted, p.String())
					}
					for _, name := range rule.ResourceNames {
						p.Name = name
						granted = append(granted, p.String())
					}
				}
			}
		}
	}
	var asked []string
	for _, p := range doctor.Permissions {
		asked = append(asked, p.String())
	}
	slices.Sort(granted)
	slices.Sort(asked)
	if len(granted) == 0 || !slices.Equal(granted, asked) {
		t.Errorf("deploy/rbac.yaml grants %q\ndoctor.Permissions are %q", granted, asked)
	}
}
