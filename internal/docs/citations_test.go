package docs

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	// citedPage is a Markdown file a comment names, with the section it
	// names if any: a fragment (concepts.md#power-off-grace), or a heading
	// quoted after it (docs/concepts.md, "How long a grace", or
	// bench/REPORT.md's "Burst").
	citedPage = regexp.MustCompile(`((?:\.\./)*(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+\.md)(?:#([A-Za-z0-9_-]+)|(?:,\s*|'s\s+)"([^"]+)")?`)
	// citedDesign is a citation of the design by section (the sign or a
	// number), or of its notes or its document: the repository has none.
	citedDesign = regexp.MustCompile(`(?i)\bdesign\s*(?:§|section\s+\d|notes?\b|doc(?:ument)?s?\b)`)
)

// TestCommentCitations: every document a comment of the repository's Go
// files cites exists, so that a comment never sends its reader to a page
// that moved or never was: a Markdown file named by its path from the
// root, from the file's own folder, or by its name alone in docs/; the
// section it names, by fragment or by quoted heading, is a heading of that
// page. No comment cites the design, by section or as notes: the
// repository has no such document. The failure lists every citation that
// does not resolve.
func TestCommentCitations(t *testing.T) {
	var bad []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path != root && strings.HasPrefix(name, "."), name == "tools", name == "node_modules", name == "testdata", name == "cdk.out":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		bad = append(bad, unresolved(t, filepath.ToSlash(rel), src)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Errorf("%d citations in Go comments do not resolve:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// The check itself: what it takes and what it lists, on a file of the
// repository's (rel) with made-up comments.
func TestCommentCitationsCheck(t *testing.T) {
	src := "package reaper\n\n" +
		"// the work queue (docs/concepts.md, \"The work\n// queue\"); bench/REPORT.md's \"Burst\" section; deploy.md;\n" +
		"// concepts.md#power-off-grace; the knobs (../../docs/reference.md);\n" +
		"// https://example.com/design/notes.md and https://example.com/docs/gone.md\n" +
		"var x = 1 // a design in this sense is fine, as by design\n\n" +
		"/* the calls (design §3, \"the work queue\") */\n\n" +
		"// docs/design.md; docs/gone.md; docs/concepts.md, \"No such section\";\n" +
		"// concepts.md#no-such-anchor; the truth table in the design notes.\n"
	got := unresolved(t, "pkg/reaper/x.go", []byte(src))
	want := []string{
		"pkg/reaper/x.go:9: design §: no design document exists",
		"pkg/reaper/x.go:11: docs/design.md: no such file",
		"pkg/reaper/x.go:11: docs/gone.md: no such file",
		`pkg/reaper/x.go:11: docs/concepts.md, "No such section": no such heading in docs/concepts.md`,
		"pkg/reaper/x.go:11: concepts.md#no-such-anchor: no such heading in docs/concepts.md",
		"pkg/reaper/x.go:11: design notes: no design document exists",
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// unresolved lists the citations of the comments of src, the Go file rel
// (from the root), that do not resolve, each with the line its comment
// starts on.
func unresolved(t *testing.T, rel string, src []byte) []string {
	t.Helper()
	var bad []string
	for _, c := range comments(src) {
		where := rel + ":" + strconv.Itoa(c.line) + ": "
		for _, m := range citedPage.FindAllStringSubmatchIndex(c.text, -1) {
			if inURL(c.text, m[0]) {
				continue
			}
			cited, frag, title := group(c.text, m, 1), group(c.text, m, 2), group(c.text, m, 3)
			page, ok := resolve(filepath.Dir(rel), cited)
			switch {
			case !ok:
				bad = append(bad, where+cited+": no such file")
			case frag != "" && !anchors(read(t, page))[frag]:
				bad = append(bad, where+cited+"#"+frag+": no such heading in "+page)
			case title != "" && !anchors(read(t, page))[slug(title)]:
				bad = append(bad, where+cited+`, "`+title+`": no such heading in `+page)
			}
		}
		for _, m := range citedDesign.FindAllString(c.text, -1) {
			bad = append(bad, where+m+": no design document exists")
		}
	}
	return bad
}

// comment is a run of comments on consecutive lines, joined with single
// spaces, so that a citation wrapped over lines reads whole.
type comment struct {
	line int // the first line's number
	text string
}

// comments are the comments of a Go source file, found with the scanner:
// a file need not compile, nor parse, to have its comments read.
func comments(src []byte) []comment {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	s.Init(file, src, nil, scanner.ScanComments)
	var out []comment
	last := -1 // the line the last comment ends on
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			return out
		}
		if tok != token.COMMENT {
			continue
		}
		line := fset.Position(pos).Line
		text := strings.TrimPrefix(lit, "//")
		if strings.HasPrefix(lit, "/*") {
			text = strings.TrimSuffix(strings.TrimPrefix(lit, "/*"), "*/")
		}
		text = strings.Join(strings.Fields(text), " ")
		if len(out) > 0 && line == last+1 {
			out[len(out)-1].text += " " + text
		} else {
			out = append(out, comment{line: line, text: text})
		}
		last = line + strings.Count(lit, "\n")
	}
}

// resolve finds a cited page: from the root, from the citing file's folder
// (dir, from the root), or in docs/ by its name alone. It returns the
// page's path from the root.
func resolve(dir, cited string) (string, bool) {
	candidates := []string{cited, filepath.Join(dir, cited)}
	if !strings.Contains(cited, "/") {
		candidates = append(candidates, filepath.Join("docs", cited))
	}
	for _, c := range candidates {
		c = filepath.ToSlash(filepath.Clean(c))
		if strings.HasPrefix(c, "../") {
			continue
		}
		if info, err := os.Stat(filepath.Join(root, filepath.FromSlash(c))); err == nil && !info.IsDir() {
			return c, true
		}
	}
	return "", false
}

// inURL says whether the match at i is part of a URL.
func inURL(text string, i int) bool {
	start := strings.LastIndexAny(text[:i], " \t(<") + 1
	return strings.Contains(text[start:i], "://")
}

// group is the n-th submatch of m in text, "" when it did not take part.
func group(text string, m []int, n int) string {
	if m[2*n] < 0 {
		return ""
	}
	return text[m[2*n]:m[2*n+1]]
}
