package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pages are the Markdown files whose links are checked, from the root.
func pages(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{"README.md", "events/README.md", "bench/REPORT.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, filepath.ToSlash(rel))
	}
	return paths
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	// link is a Markdown link or image: [text](target).
	link = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("(?m)^\\s*```")
	// heading is an ATX heading.
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	// htmlAnchor is an explicit anchor.
	htmlAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
)

// prose is the text outside fenced code blocks.
func prose(text string) string {
	parts := fence.Split(text, -1)
	var b strings.Builder
	for i := 0; i < len(parts); i += 2 {
		b.WriteString(parts[i])
	}
	return b.String()
}

// anchors are the fragments GitHub gives a page's headings: lower case,
// punctuation dropped, spaces as hyphens, "-1", "-2"… for repeats.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(prose(text), -1) {
		slug := slug(m[1])
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

// slug is the fragment GitHub gives a heading of that text.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// links are a page's relative link targets, outside code blocks, resolved
// against the root: the path and the fragment.
func links(page, text string) [][2]string {
	var out [][2]string
	for _, m := range link.FindAllStringSubmatch(prose(text), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, frag, _ := strings.Cut(target, "#")
		if path == "" {
			path = page
		} else {
			path = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path)))
		}
		out = append(out, [2]string{path, frag})
	}
	return out
}

// TestLinks: every relative link of the docs names a file of the
// repository and, with a fragment, a heading of that page.
func TestLinks(t *testing.T) {
	for _, page := range pages(t) {
		for _, l := range links(page, read(t, page)) {
			path, frag := l[0], l[1]
			if strings.HasPrefix(path, "../") {
				t.Errorf("%s: link to %s leaves the repository", page, path)
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(path))); err != nil {
				t.Errorf("%s: link to %s: %v", page, path, err)
				continue
			}
			if frag != "" {
				if !strings.HasSuffix(path, ".md") {
					t.Errorf("%s: link to %s#%s: a fragment of a page that is not Markdown", page, path, frag)
				} else if !anchors(read(t, path))[frag] {
					t.Errorf("%s: link to %s#%s: no such heading", page, path, frag)
				}
			}
		}
	}
}

// TestEveryPageReachable: every page of docs/ can be reached from the front
// page by following links.
func TestEveryPageReachable(t *testing.T) {
	seen := map[string]bool{"README.md": true}
	queue := []string{"README.md"}
	for len(queue) > 0 {
		page := queue[0]
		queue = queue[1:]
		for _, l := range links(page, read(t, page)) {
			if strings.HasSuffix(l[0], ".md") && !seen[l[0]] {
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(l[0]))); err == nil {
					seen[l[0]] = true
					queue = append(queue, l[0])
				}
			}
		}
	}
	for _, page := range pages(t) {
		if !seen[page] {
			t.Errorf("%s cannot be reached from README.md", page)
		}
	}
}

// TestFrontPage: the front page stays short, gives the two commands CI and
// newcomers rely on, and states the versions the build uses.
func TestFrontPage(t *testing.T) {
	readme := read(t, "README.md")
	if n := strings.Count(readme, "\n"); n > 150 {
		t.Errorf("README.md has %d lines, more than 150: move the detail to docs/", n)
	}
	for _, cmd := range []string{"make replay", "make test"} {
		if !regexp.MustCompile(`(?m)^` + cmd + `\b`).MatchString(readme) {
			t.Errorf("README.md does not give the command %q on a line of its own", cmd)
		}
	}
	if !strings.Contains(read(t, ".ci/run"), "\nmake test\n") {
		t.Error(".ci/run does not run make test")
	}

	gomod, setup, npm := read(t, "go.mod"), read(t, "hack/setup.sh"), read(t, "tools/node/package.json")
	find := func(text, pattern, what string) string {
		m := regexp.MustCompile(pattern).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no %s (%s)", what, pattern)
		}
		return m[1]
	}
	matrix := map[string][]string{
		"Kubernetes":      {find(setup, `(?m)^KUBE_VERSION=(\S+)`, "KUBE_VERSION in hack/setup.sh")},
		"virtual-kubelet": {find(gomod, `virtual-kubelet/virtual-kubelet (v\S+)`, "virtual-kubelet in go.mod")},
		"Go":              {find(gomod, `(?m)^go (\S+)`, "go directive in go.mod")},
		"AWS CDK": {
			find(gomod, `aws-cdk-go/awscdk/v2 (v\S+)`, "awscdk in go.mod"),
			find(npm, `"aws-cdk": "([^"]+)"`, "aws-cdk in tools/node/package.json"),
		},
	}
	rows := map[string]string{}
	for _, line := range strings.Split(readme, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) > 3 {
			rows[strings.TrimSpace(cells[1])] = cells[2]
		}
	}
	for name, versions := range matrix {
		row, ok := rows[name]
		if !ok {
			t.Errorf("README.md's support matrix has no row %s", name)
			continue
		}
		for _, v := range versions {
			if !strings.Contains(row, v) {
				t.Errorf("README.md's support matrix says %q for %s; the build uses %s", strings.TrimSpace(row), name, v)
			}
		}
	}
}

var (
	// codeSpan is inline code.
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	// testName names a Go test or benchmark.
	testName = regexp.MustCompile(`\b((?:Test|Benchmark)[A-Z]\w*)`)
	// testFunc declares one.
	testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark)\w+)\(`)
	// repoPath is a path into the repository.
	repoPath = regexp.MustCompile(`^(?:pkg|internal|cmd|infra|deploy|charts|bench|events|examples|functions|hack|testdata|tools|docs)/[\w./*-]*$`)
)

// TestNamedTestsAndFilesExist: every test, benchmark and repository path
// the docs name in code exists, so that a figure or a claim never points at
// a test that was renamed or a file that moved.
func TestNamedTestsAndFilesExist(t *testing.T) {
	declared := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "tools" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, "_test.go") {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
				declared[m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, page := range pages(t) {
		if page == "bench/REPORT.md" {
			continue // a dated record: it names what existed when it ran
		}
		for _, span := range codeSpan.FindAllStringSubmatch(prose(read(t, page)), -1) {
			for _, name := range testName.FindAllString(span[1], -1) {
				if !declared[name] {
					t.Errorf("%s names %s, which no test file declares", page, name)
				}
			}
			for _, field := range strings.Fields(span[1]) {
				if repoPath.MatchString(field) && !pathExists(field) {
					t.Errorf("%s names %s, which is not in the repository", page, field)
				}
			}
		}
	}
}

// pathExists reports whether a path, a glob, or the directory before a
// "**" exists.
func pathExists(path string) bool {
	if before, _, ok := strings.Cut(path, "**"); ok {
		path = strings.TrimSuffix(before, "/")
	}
	matches, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(path, "/"))))
	return err == nil && len(matches) > 0 && !slices.Contains(matches, "")
}
