package docs

import (
	"fmt"
	"go/ast"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Flag is one flag of a command, as its -h prints it.
type Flag struct {
	Name, Type, Default, Usage string
}

// Help is what a command's -h prints: the text before the flags, and the
// flags.
type Help struct {
	Preamble string
	Flags    []Flag
}

// commandHelp builds the operator's CLI (cmd/reaper) and runs `reaper
// <verb> -h`: the flags as the flag package itself lists them, defaults
// included.
func commandHelp(root, verb string) (Help, error) {
	dir, err := os.MkdirTemp("", "reaper-docs-")
	if err != nil {
		return Help{}, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "reaper")
	build := exec.Command("go", "build", "-o", bin, "./cmd/reaper")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return Help{}, fmt.Errorf("go build ./cmd/reaper: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, verb, "-h").CombinedOutput()
	if err != nil {
		return Help{}, fmt.Errorf("reaper %s -h: %v\n%s", verb, err, out)
	}
	return parseHelp(string(out))
}

// flagDefault is the "(default …)" flag.PrintDefaults appends to a usage.
var flagDefault = regexp.MustCompile(` \(default (.*)\)$`)

// parseHelp reads the output of a flag.FlagSet's Usage: free text, then
// flag.PrintDefaults' entries ("  -name type" and the usage on lines
// indented by a tab).
func parseHelp(out string) (Help, error) {
	var h Help
	var pre []string
	var cur *Flag
	for line := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "  -"):
			f := strings.Fields(line)
			h.Flags = append(h.Flags, Flag{Name: strings.TrimPrefix(f[0], "-")})
			cur = &h.Flags[len(h.Flags)-1]
			if len(f) > 1 {
				cur.Type = f[1]
			}
		case cur != nil && strings.HasPrefix(line, "    \t"):
			cur.Usage = strings.TrimSpace(cur.Usage + " " + strings.TrimSpace(line))
		case cur == nil:
			pre = append(pre, line)
		default:
			return Help{}, fmt.Errorf("unexpected line after the flags: %q", line)
		}
	}
	if len(h.Flags) == 0 {
		return Help{}, fmt.Errorf("no flags in %q", out)
	}
	for i := range h.Flags {
		f := &h.Flags[i]
		if m := flagDefault.FindStringSubmatch(f.Usage); m != nil {
			f.Usage = strings.TrimSuffix(f.Usage, m[0])
			f.Default = m[1]
			if s, err := strconv.Unquote(m[1]); err == nil {
				f.Default = s
			}
		}
	}
	// The flag list's own heading, if any, is the reference's.
	for len(pre) > 0 && (strings.TrimSpace(pre[len(pre)-1]) == "" || strings.HasSuffix(pre[len(pre)-1], ":")) {
		pre = pre[:len(pre)-1]
	}
	h.Preamble = strings.Join(pre, "\n")
	return h, nil
}

// optionFlags maps each userdata.Options field the CLI (cmd/reaper's
// userdata verb) sets from a flag to that flag: the calls
// fs.XxxVar(&opts.Field, "flag", …).
func optionFlags(cliDir string) (map[string]string, error) {
	files, err := parsePackage(cliDir)
	if err != nil {
		return nil, err
	}
	flags := map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			addr, ok := call.Args[0].(*ast.UnaryExpr)
			if !ok {
				return true
			}
			sel, ok := addr.X.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "opts" {
				return true
			}
			if name, err := stringValue(call.Args[1]); err == nil {
				flags[sel.Sel.Name] = name
			}
			return true
		})
	}
	return flags, nil
}
