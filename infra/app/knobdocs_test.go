package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/reaper-k8s/reaper/infra/cdktest"
	"github.com/reaper-k8s/reaper/infra/reapercdk"
	"github.com/reaper-k8s/reaper/internal/docs"
)

// TestKnobDocs holds the configuration reference's defaults to the stack:
// each default that is a value, given as the knob, is what the construct
// uses without it (or, where the construct leaves the variable to the
// functions, the documented default is the variable's own).
func TestKnobDocs(t *testing.T) {
	knobsDocumented, err := docs.Knobs(".")
	if err != nil {
		t.Fatal(err)
	}
	// The reference reads knobDocs from the source; it must read what the
	// compiler compiles.
	if len(knobsDocumented) != len(knobDocs) {
		t.Fatalf("the reference reads %d rows of knobDocs, the app holds %d", len(knobsDocumented), len(knobDocs))
	}
	for i, d := range knobDocs {
		k := knobsDocumented[i]
		if k.Key != d.key || k.Env != d.env || k.Required != d.required || k.Doc != d.doc || (d.def != "" && k.Default != d.def) {
			t.Errorf("knobDocs[%d] is %+v, the reference reads %+v", i, d, k)
		}
	}
	const cluster = "prod"
	var r *reapercdk.Reaper
	cdktest.Must(t, func() {
		_, r, err = newStack(appWith(t, map[string]any{"eksCluster": cluster}))
	})
	if err != nil {
		t.Fatal(err)
	}
	apply := map[string]func(*reapercdk.Props, string) error{}
	for _, k := range knobs {
		apply[k.name] = k.apply
	}
	for _, k := range knobsDocumented {
		v, ok := k.Value()
		if !ok {
			continue
		}
		v = strings.ReplaceAll(v, "<cluster>", cluster)
		if k.Field == "" {
			if k.Key != "stackName" || defaultStackName(cluster) != v {
				t.Errorf("%s: default %q, the app names the stack %q", k.Key, v, defaultStackName(cluster))
			}
			continue
		}
		var p reapercdk.Props
		if err := apply[k.Key](&p, v); err != nil {
			t.Errorf("%s: the documented default %q is refused: %v", k.Key, v, err)
			continue
		}
		got, want := field(p, k.Field), field(r.Props, k.Field)
		if k.Key == "buildDir" {
			// The harness sets it to its placeholder bundles.
			want = reflect.ValueOf(reapercdk.DefaultBuildDir)
		}
		if want.IsZero() && k.EnvDefault() {
			continue // the construct sets no variable: the functions' default holds
		}
		if !reflect.DeepEqual(deref(got).Interface(), deref(want).Interface()) {
			t.Errorf("%s: documented default %q sets %s to %v, the construct's default is %v", k.Key, v, k.Field, deref(got), deref(want))
		}
	}
}

// field is the value at a Props field path such as "Tags.PodUID".
func field(p reapercdk.Props, path string) reflect.Value {
	v := reflect.ValueOf(p)
	for name := range strings.SplitSeq(path, ".") {
		v = v.FieldByName(name)
	}
	return v
}

func deref(v reflect.Value) reflect.Value {
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		return v.Elem()
	}
	return v
}
