package model

import (
	"strings"
	"testing"
)

func TestStateRankOrdersALifecycle(t *testing.T) {
	order := []string{StatePending, StateRunning, StateStopping, StateStopped, StateShuttingDown, StateTerminated}
	for i := 1; i < len(order); i++ {
		if StateRank(order[i-1]) >= StateRank(order[i]) {
			t.Errorf("%s does not rank before %s", order[i-1], order[i])
		}
	}
	for _, s := range order {
		if !KnownState(s) {
			t.Errorf("%s is not known", s)
		}
	}
	if KnownState("exploded") {
		t.Error("an unknown state is known")
	}
}

func TestGoneAndEnding(t *testing.T) {
	for _, tc := range []struct {
		state        string
		gone, ending bool
	}{
		{StatePending, false, false}, {StateRunning, false, false},
		{StateStopping, true, false}, {StateStopped, true, false},
		{StateShuttingDown, true, true}, {StateTerminated, true, true},
	} {
		if IsGone(tc.state) != tc.gone || IsEnding(tc.state) != tc.ending {
			t.Errorf("%s: gone %v ending %v, want %v %v", tc.state, IsGone(tc.state), IsEnding(tc.state), tc.gone, tc.ending)
		}
	}
}

func TestOutcomeKeys(t *testing.T) {
	if k := (Outcome{Exits: []Exit{{Container: "main", RestartCount: 3}}}).Key(); k != "exit/3" {
		t.Errorf("exit key %q", k)
	}
	if k := (Outcome{Lost: &Gone{}, Exits: []Exit{{Container: "main"}}}).Key(); k != OutcomeLost {
		t.Errorf("lost key %q", k)
	}
	two := Outcome{Exits: []Exit{{Container: "a", RestartCount: 1}, {Container: "b"}}}
	if k := two.Key(); k != "a=exit/1,b=exit/0" {
		t.Errorf("two containers' key %q", k)
	}
	two.SidecarsLost = true
	if k := two.Key(); k != "a=exit/1,b=exit/0+sidecars-lost" {
		t.Errorf("sidecars lost key %q", k)
	}
	// Every state a Pod's containers can report has its own key, so a
	// write already made is never taken for another.
	seen := map[string]Outcome{}
	for _, o := range []Outcome{
		{Exits: []Exit{{Container: "a"}}}, {Exits: []Exit{{Container: "a", RestartCount: 1}}},
		{Exits: []Exit{{Container: "a"}, {Container: "b"}}}, {Exits: []Exit{{Container: "a", RestartCount: 1}, {Container: "b"}}},
		{Exits: []Exit{{Container: "a"}, {Container: "b", RestartCount: 1}}}, {Exits: []Exit{{Container: "a"}}, SidecarsLost: true},
		{Lost: &Gone{}},
	} {
		if prev, dup := seen[o.Key()]; dup {
			t.Errorf("%+v and %+v share the key %q", prev, o, o.Key())
		}
		seen[o.Key()] = o
	}
}

func TestTagKeysWithDefaults(t *testing.T) {
	got := TagKeys{PodUID: "example.com/uid"}.WithDefaults()
	want := DefaultTagKeys()
	want.PodUID = "example.com/uid"
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// The instance ids EC2 accepts: "i-" and 8 or 17 lower-case hex digits.
// Every other length EC2 answers InvalidInstanceID.Malformed, failing the
// whole call that names it.
func TestValidInstanceID(t *testing.T) {
	for n := 0; n <= 20; n++ {
		id := "i-" + strings.Repeat("0123456789abcdef", 2)[:n]
		if got, want := ValidInstanceID(id), n == 8 || n == 17; got != want {
			t.Errorf("ValidInstanceID(%q) (%d digits) = %v, want %v", id, n, got, want)
		}
	}
	for _, id := range []string{"i-0123456789ABCDEF0", "i-0123456789abcdeg0", "I-0123456789abcdef0", " i-01234567", "i-01234567\n", "i-"} {
		if ValidInstanceID(id) {
			t.Errorf("ValidInstanceID(%q) = true", id)
		}
	}
}

// The keys EC2 accepts on an instance whose tags the instance metadata
// shows.
func TestValidMetadataTagKey(t *testing.T) {
	for key, want := range map[string]bool{
		"reaper.io:pod-written": true, "Pod_Written+1=a,b@c": true, strings.Repeat("k", 128): true,
		"reaper.io/pod-written": false, "pod written": false, "": false, ".": false, "..": false, "_index": false,
		"aws:x": false, "AWS:x": false, strings.Repeat("k", 129): false, "pöd": false,
	} {
		if got := ValidMetadataTagKey(key); got != want {
			t.Errorf("ValidMetadataTagKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// The exit-token tag's value is the token's SHA-256 in lower-case hex, the
// one form ValidExitTokenHash accepts; tokens are bounded in length and
// characters.
func TestExitToken(t *testing.T) {
	// SHA-256 of "abc", from FIPS 180-2, appendix B.1.
	if got := ExitTokenHash("abc"); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("ExitTokenHash(abc) = %s", got)
	}
	if h := ExitTokenHash(strings.Repeat("f", 64)); !ValidExitTokenHash(h) {
		t.Errorf("ExitTokenHash writes %q, which ValidExitTokenHash refuses", h)
	}
	for h, want := range map[string]bool{
		strings.Repeat("0a", 32): true, strings.Repeat("0A", 32): false, strings.Repeat("0a", 31): false,
		strings.Repeat("0a", 32) + "0": false, strings.Repeat("g", 64): false, "": false,
	} {
		if got := ValidExitTokenHash(h); got != want {
			t.Errorf("ValidExitTokenHash(%q) = %v, want %v", h, got, want)
		}
	}
	for token, want := range map[string]bool{
		strings.Repeat("a", 32): true, strings.Repeat("Z9_-", 32): true, strings.Repeat("a", 31): false,
		strings.Repeat("a", 129): false, strings.Repeat("a", 31) + "=": false, strings.Repeat("a", 31) + "\"": false,
		strings.Repeat("a", 31) + " ": false, "": false,
	} {
		if got := ValidExitToken(token); got != want {
			t.Errorf("ValidExitToken(%q) = %v, want %v", token, got, want)
		}
	}
}
