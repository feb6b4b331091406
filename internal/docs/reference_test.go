package docs

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/reference.md from the code")

// root is the repository, from this package's directory.
const root = "../.."

// TestReferenceIsCurrent fails when docs/reference.md is not what the code
// generates: a knob, variable, tag, option or flag added, removed or
// changed without the reference.
func TestReferenceIsCurrent(t *testing.T) {
	got, err := Reference(root)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, ReferencePath)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("%s is not what the code generates (go test ./internal/docs -update, then review the diff):\n%s",
			ReferencePath, firstDifference(string(want), got))
	}
}

// firstDifference shows the first line where a and b differ.
func firstDifference(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range max(len(al), len(bl)) {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return "line " + strconv.Itoa(i+1) + ":\n- " + x + "\n+ " + y
		}
	}
	return ""
}

// TestKnobWithoutItsRow adds a knob to a copy of the CDK app without
// documenting it: the reference cannot be generated, and the error names
// the knob. A documented key that the app no longer reads fails too.
func TestKnobWithoutItsRow(t *testing.T) {
	if _, err := Knobs(filepath.Join(root, "infra/app")); err != nil {
		t.Fatalf("the app's own knobs: %v", err)
	}
	for name, tc := range map[string]struct{ old, new, want string }{
		"knob without its row": {
			old:  `var knobs = []knob{`,
			new:  "var knobs = []knob{\n\t{\"fakeKnob\", str(func(p *reapercdk.Props) *string { return &p.BuildDir })},",
			want: `context key "fakeKnob" has no row in knobDocs`,
		},
		"row without its knob": {
			old:  `var knobDocs = []knobDoc{`,
			new:  "var knobDocs = []knobDoc{\n\t{key: \"goneKnob\", def: \"none\", doc: \"Gone.\"},",
			want: `"goneKnob" is not a context key the app reads`,
		},
		"row without a doc": {
			old:  `doc: "Directory holding ` + "`<function>/bootstrap`" + ` as ` + "`make build`" + ` writes it."`,
			new:  `doc: ""`,
			want: `"buildDir" has no doc`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			changed := false
			files, err := filepath.Glob(filepath.Join(root, "infra/app/*.go"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				s := string(b)
				if strings.Contains(s, tc.old) {
					s, changed = strings.Replace(s, tc.old, tc.new, 1), true
				}
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if !changed {
				t.Fatalf("no file of infra/app holds %q", tc.old)
			}
			_, err = Knobs(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Knobs: %v, want an error saying %s", err, tc.want)
			}
		})
	}
}
