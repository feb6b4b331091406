package labstack

import (
	"testing"
)

// MustStart starts a Stack for the duration of a test: it fails the test
// if the stack cannot start and stops it in t.Cleanup. When the test has
// failed, the cleanup logs the tail of every process log and keeps Dir.
func MustStart(t testing.TB, opts Options) *Stack {
	t.Helper()
	s, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, path := range s.logs() {
				t.Logf("tail of %s:\n%s", path, tailFile(path, 30))
			}
			s.opts.KeepDir = true
			t.Logf("labstack: kept %s", s.Dir)
		}
		s.Stop()
	})
	return s
}

// MustStartFunction starts a Function for the duration of a test, failing
// the test on error. When the test has failed, the cleanup logs the
// function's output.
func MustStartFunction(t testing.TB, bootstrapPath string, env []string) *Function {
	t.Helper()
	f, err := StartFunction(t.Context(), bootstrapPath, env)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Stop()
		if t.Failed() {
			t.Logf("function %s output:\n%s", f.Name, f.Logs())
		}
	})
	return f
}
