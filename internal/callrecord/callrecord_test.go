package callrecord

import (
	"maps"
	"testing"
)

type tagged struct {
	Call
	tag string
}

func TestCounts(t *testing.T) {
	var r Record[tagged]
	for _, c := range []tagged{
		{Call{Action: "TerminateInstances"}, "a"},
		{Call{Action: "TerminateInstances", ErrorCode: "RequestLimitExceeded"}, "b"},
		{Call{Action: "DescribeInstances"}, "a"},
	} {
		r.Add(c)
	}
	if got, want := r.Counts(), map[string]int{"TerminateInstances": 2, "DescribeInstances": 1}; !maps.Equal(got, want) {
		t.Errorf("Counts() = %v, want %v", got, want)
	}
	failed := r.CountsFunc(func(c tagged) bool { return c.ErrorCode != "" })
	if want := map[string]int{"TerminateInstances": 1}; !maps.Equal(failed, want) {
		t.Errorf("CountsFunc(failed) = %v, want %v", failed, want)
	}
	if n := r.CountFunc(func(c tagged) bool { return c.tag == "a" }); n != 2 {
		t.Errorf("CountFunc(tag a) = %d, want 2", n)
	}
	r.Reset()
	if got := r.Counts(); len(got) != 0 || got == nil {
		t.Errorf("Counts() after Reset = %#v, want an empty map", got)
	}
}
