package docs

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// parsePackage parses the non-test Go files of dir, with their comments.
func parsePackage(dir string) ([]*ast.File, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no Go files", dir)
	}
	return files, nil
}

// sliceLiteral finds `var name = []T{...}` in files and returns its
// elements.
func sliceLiteral(files []*ast.File, name string) ([]ast.Expr, error) {
	for _, f := range files {
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.VAR {
				continue
			}
			for _, spec := range gen.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.CompositeLit)
					if !ok {
						return nil, fmt.Errorf("var %s is not a composite literal", name)
					}
					return lit.Elts, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no var %s", name)
}

// stringValue is the value of a string literal, or of literals joined with
// +.
func stringValue(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.STRING {
			return strconv.Unquote(e.Value)
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			l, err := stringValue(e.X)
			if err != nil {
				return "", err
			}
			r, err := stringValue(e.Y)
			return l + r, err
		}
	case *ast.ParenExpr:
		return stringValue(e.X)
	}
	return "", fmt.Errorf("%T is not a string literal", e)
}

// keyedStrings reads a struct literal whose fields are all string literals,
// keyed by field name.
func keyedStrings(e ast.Expr) (map[string]string, error) {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("%T is not a struct literal", e)
	}
	fields := map[string]string{}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return nil, fmt.Errorf("field %d is not keyed", len(fields))
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			return nil, fmt.Errorf("field key %T", kv.Key)
		}
		v, err := stringValue(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("field %s: %v", key.Name, err)
		}
		fields[key.Name] = v
	}
	return fields, nil
}

// fieldDocs are the doc comments of the fields of struct type typeName in
// dir's package, each as one paragraph.
func fieldDocs(dir, typeName string) (map[string]string, []string, error) {
	files, err := parsePackage(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		var found *ast.StructType
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == typeName {
				found, _ = ts.Type.(*ast.StructType)
				return false
			}
			return found == nil
		})
		if found == nil {
			continue
		}
		docs := map[string]string{}
		var order []string
		for _, field := range found.Fields.List {
			for _, n := range field.Names {
				docs[n.Name] = paragraph(field.Doc.Text())
				order = append(order, n.Name)
			}
		}
		return docs, order, nil
	}
	return nil, nil, fmt.Errorf("%s: no struct type %s", dir, typeName)
}

// paragraph joins a comment's lines into one.
func paragraph(text string) string { return strings.Join(strings.Fields(text), " ") }

// readFile reads a file of the repository.
func readFile(root, path string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	return string(b), err
}
