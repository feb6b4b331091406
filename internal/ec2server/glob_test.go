package ec2server

import "testing"

func TestGlob(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"true", "true", true},
		{"true", "True", false},
		{"reaper.io/*", "reaper.io/pod-name", true},
		{"*", "", true},
		{"?", "", false},
		{"i-????????", "i-0123abcd", true},
		{"*-name", "reaper.io/pod-name", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
	} {
		if got := glob(c.pattern, c.s); got != c.want {
			t.Errorf("glob(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}
