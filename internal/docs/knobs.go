package docs

import (
	"errors"
	"fmt"
	"go/ast"
	"slices"
	"strings"

	"github.com/reaper-k8s/reaper/pkg/config"
)

// Knob is one CDK context key of the default app (infra/app), as the
// reference lists it.
type Knob struct {
	Key string
	// Field is the reapercdk.Props field the key sets ("Tags.PodUID"),
	// empty for a key the app reads itself (stackName).
	Field string
	// Env is the functions' variable the key sets, if any.
	Env      string
	Required string
	// Default is a value in backticks ("<cluster>" standing for the
	// cluster's name), or words.
	Default string
	Doc     string
	// ownDefault: Default is the app's knobDocs' own, not Env's.
	ownDefault bool
}

// Value is the default as a context value, when it is one.
func (k Knob) Value() (string, bool) {
	v, ok := strings.CutPrefix(k.Default, "`")
	if !ok {
		return "", false
	}
	v, ok = strings.CutSuffix(v, "`")
	return v, ok && !strings.Contains(v, "`")
}

// EnvDefault reports whether the default is the functions' variable's.
func (k Knob) EnvDefault() bool { return !k.ownDefault && k.Env != "" }

// Knobs reads the context keys of the CDK app in appDir from its own
// tables: the keys from knobs (with the Props field each one's apply sets)
// and from the app's contextValue calls with a literal key, their
// documentation from knobDocs. A key without its knobDocs row, a row
// without its key, a row without a doc and a variable config.Vars does
// not list are errors.
func Knobs(appDir string) ([]Knob, error) {
	files, err := parsePackage(appDir)
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	var keys []string
	var errs []error
	elts, err := sliceLiteral(files, "knobs")
	if err != nil {
		return nil, err
	}
	for i, elt := range elts {
		key, field, err := knobEntry(elt)
		if err != nil {
			errs = append(errs, fmt.Errorf("knobs[%d]: %v", i, err))
			continue
		}
		fields[key] = field
		keys = append(keys, key)
	}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && len(call.Args) == 2 {
				if fn, ok := call.Fun.(*ast.Ident); ok && fn.Name == "contextValue" {
					if key, err := stringValue(call.Args[1]); err == nil {
						keys = append(keys, key)
					}
				}
			}
			return true
		})
	}

	vars := map[string]config.Var{}
	for _, v := range config.Vars {
		vars[v.Name] = v
	}
	docElts, err := sliceLiteral(files, "knobDocs")
	if err != nil {
		return nil, err
	}
	var knobs []Knob
	documented := map[string]bool{}
	for i, elt := range docElts {
		row, err := keyedStrings(elt)
		if err != nil {
			errs = append(errs, fmt.Errorf("knobDocs[%d]: %v", i, err))
			continue
		}
		k := Knob{Key: row["key"], Field: fields[row["key"]], Env: row["env"], Required: row["required"], Default: row["def"], Doc: row["doc"]}
		k.ownDefault = k.Default != ""
		switch {
		case documented[k.Key]:
			errs = append(errs, fmt.Errorf("knobDocs: %q has two rows", k.Key))
		case !slices.Contains(keys, k.Key):
			errs = append(errs, fmt.Errorf("knobDocs: %q is not a context key the app reads", k.Key))
		case k.Doc == "":
			errs = append(errs, fmt.Errorf("knobDocs: %q has no doc", k.Key))
		}
		documented[k.Key] = true
		if k.Env != "" {
			v, ok := vars[k.Env]
			if !ok {
				errs = append(errs, fmt.Errorf("knobDocs: %q sets %s, which config.Vars does not list", k.Key, k.Env))
			}
			if !k.ownDefault {
				k.Default = "none"
				if v.Default != "" {
					k.Default = "`" + v.Default + "`"
				}
			}
		} else if !k.ownDefault {
			errs = append(errs, fmt.Errorf("knobDocs: %q has neither a default nor a variable to take it from", k.Key))
		}
		knobs = append(knobs, k)
	}
	for _, key := range keys {
		if !documented[key] {
			errs = append(errs, fmt.Errorf("context key %q has no row in knobDocs (infra/app/knobdocs.go): add one, then go test ./internal/docs -update", key))
		}
	}
	return knobs, errors.Join(errs...)
}

// knobEntry reads one element of the app's knobs: its key, and the Props
// field its apply function sets (the one selector path rooted at the
// function's *reapercdk.Props parameter).
func knobEntry(elt ast.Expr) (key, field string, err error) {
	lit, ok := elt.(*ast.CompositeLit)
	if !ok || len(lit.Elts) == 0 {
		return "", "", fmt.Errorf("%T is not a knob literal", elt)
	}
	first := lit.Elts[0]
	if kv, ok := first.(*ast.KeyValueExpr); ok {
		first = kv.Value
	}
	if key, err = stringValue(first); err != nil {
		return "", "", fmt.Errorf("key: %v", err)
	}
	var paths []string
	ast.Inspect(lit, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncLit)
		if !ok || len(fn.Type.Params.List) == 0 || !isPropsPointer(fn.Type.Params.List[0].Type) || len(fn.Type.Params.List[0].Names) == 0 {
			return true
		}
		param := fn.Type.Params.List[0].Names[0].Name
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if path, ok := selectorPath(sel, param); ok {
				paths = append(paths, path)
				return false // the longest path rooted here
			}
			return true
		})
		return false
	})
	slices.Sort(paths)
	paths = slices.Compact(paths)
	if len(paths) != 1 {
		return key, "", fmt.Errorf("%s: its apply sets %d Props fields %v, want 1", key, len(paths), paths)
	}
	return key, paths[0], nil
}

// isPropsPointer reports whether e is *reapercdk.Props.
func isPropsPointer(e ast.Expr) bool {
	star, ok := e.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Props"
}

// selectorPath is "A.B" for param.A.B.
func selectorPath(sel *ast.SelectorExpr, param string) (string, bool) {
	switch x := sel.X.(type) {
	case *ast.Ident:
		return sel.Sel.Name, x.Name == param
	case *ast.SelectorExpr:
		p, ok := selectorPath(x, param)
		return p + "." + sel.Sel.Name, ok
	}
	return "", false
}
